"""What every cudasnap command shares on the command line: bad option values as one line
(exit 2), arguments shown by name, help laid out for where it is shown, and `fail`."""
from __future__ import annotations

import sys
from typing import Optional

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

from cudasnap.console import is_tty


def help_width() -> Optional[int]:
    """Help is laid out for the terminal it is shown on; in a pipe or a log, for 100 columns
    (not 80, which squeezes replay's option descriptions into a narrow column)."""
    return None if is_tty(sys.stdout) else 100


class Argument(TyperArgument):
    """An argument shown by its name alone: no type placeholder (<path>), no braces."""

    def display_type_rich(self, ctx) -> None:
        return None

    def _usage_display_name(self) -> str:
        return self.display_name_raw + ("..." if self.nargs != 1 else "")


class Command(TyperCommand):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        for p in self.params:
            if type(p) is TyperArgument:
                p.__class__ = Argument

    def invoke(self, ctx):
        """Ctrl-C is 130 in every command, with one line saying what it left (typer's own
        handler exits 130 silently)."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as e:
            from cudasnap.exits import report_interrupt
            raise typer.Exit(report_interrupt(e)) from None
        except BrokenPipeError:     # a write that bypassed the pipe-safe streams: the verdict is lost
            import os
            nul = os.open(os.devnull, os.O_WRONLY)
            os.dup2(nul, 1)
            raise typer.Exit(141) from None     # as a shell reports death by SIGPIPE; never 0 (typer says 1)

    def parse_args(self, ctx, args):
        """A value outside an option's declared choices or range is one line, as every other
        cudasnap error: 'cudasnap: error: Invalid value for '--level': ...'."""
        ctx.meta["cudasnap.args"] = list(args)          # replay --wrap re-executes these
        try:
            return super().parse_args(ctx, args)
        except typer.BadParameter as e:
            typer.echo(f"cudasnap: error: {' '.join(e.format_message().split())}", err=True)
            ctx.exit(2)


class Group(TyperGroup):
    """The `cudasnap` group: Ctrl-C while a command is being found or parsed is 130 with its
    line too, as in a command's body."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as e:
            from cudasnap.exits import report_interrupt
            raise typer.Exit(report_interrupt(e)) from None


def one_line_usage_errors() -> None:
    """Usage errors (an unknown option or command, a missing argument) as one line, as every other
    cudasnap error, not click's usage block; set by the `cudasnap` entry point only."""
    try:
        from typer import _click as click            # the click typer carries (typer >= 0.16)
    except ImportError:
        import click

    def show(self, file=None) -> None:
        where = f" ({self.ctx.command_path} -h lists them)" if self.ctx is not None else ""
        typer.echo(f"cudasnap: error: {' '.join(self.format_message().split())}{where}", err=True)
    click.exceptions.UsageError.show = show


def fail(msg: str, code: int = 2) -> None:
    """One line on stderr, then exit `code`."""
    typer.echo(f"cudasnap: error: {msg}", err=True)
    raise typer.Exit(code)
