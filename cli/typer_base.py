"""What every cudasnap command shares on the command line: bad option values as one line
(exit 2), numbers finite and in range, options that act only with another one (`Inert`),
arguments shown by name, help laid out for where it is shown, and `fail`."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional

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


try:
    from typer._click.core import ParameterSource     # the click typer carries (typer >= 0.16)
except ImportError:
    from click.core import ParameterSource

INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Inert:
    """An option that does nothing unless `active(params)` holds: given anyway, it is refused
    naming both options (`warn`: a warning only, where ncu or nsys would only warn)."""
    option: str                               # the parameter's name
    when: str                                 # where it does nothing: "without --window kernel:REGEX"
    active: Callable[[Dict[str, Any]], bool]
    fix: Optional[str] = None                 # what to do (default: leave the option out)
    warn: bool = False


def needs(*rules: Inert):
    """Declare a command's Inert options (checked by Command before the command runs)."""
    def deco(fn):
        fn.__dict__.setdefault("cudasnap_inert", []).extend(rules)
        return fn
    return deco


def option_name(p) -> str:
    longs = [o for o in getattr(p, "opts", []) if o.startswith("--")]
    return (longs or list(getattr(p, "opts", [])) or [p.name])[0]


def number_problem(p, value) -> Optional[str]:
    """A number no option means: NaN or infinity (`1e309`), or an integer past 64 bits (no
    count, size or ordinal reaches it; the shim and the file format hold 64 bits)."""
    for v in value if isinstance(value, (list, tuple)) else (value,):
        if isinstance(v, bool):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            return f"{option_name(p)}: {v} is not a finite number"
        if isinstance(v, int) and not -INT64_MAX - 1 <= v <= INT64_MAX:
            return f"{option_name(p)}: {v} is out of range (at most {INT64_MAX})"
    return None


def given(ctx, name: str) -> bool:
    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def inert_problems(ctx, rules) -> list:
    """(message, warn) for each Inert option given where it does nothing."""
    by_name = {p.name: p for p in ctx.command.params}
    out = []
    for r in rules:
        if given(ctx, r.option) and not r.active(ctx.params):
            opt = option_name(by_name[r.option])
            out.append((f"{opt} has no effect {r.when}: {r.fix or f'leave {opt} out'}", r.warn))
    return out


# the parameters that name what a command writes; every other path parameter is read
OUTPUT_PARAMS = frozenset({"output", "out", "out_file", "html", "trace", "keep"})


def special_input(ctx) -> Optional[str]:
    """The first input path given that is a FIFO, a device, a socket or a kernel file, refused
    by type before anything reads it (a FIFO blocks the reader, /dev/zero never ends)."""
    from pathlib import PurePath
    from cudasnap.formats.inputs import input_problem
    for name, v in ctx.params.items():
        if name in OUTPUT_PARAMS:
            continue
        for x in v if isinstance(v, (list, tuple)) else (v,):
            if isinstance(x, str) and name == "replace" and "=" in x:
                x = PurePath(x.split("=", 1)[1])      # --replace KERNEL=FILE
            if isinstance(x, PurePath):
                why = input_problem(x)
                if why:
                    return why
    return None


class Command(TyperCommand):
    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        for p in self.params:
            if type(p) is TyperArgument:
                p.__class__ = Argument

    def invoke(self, ctx):
        """Ctrl-C is 130 in every command, with one line saying what it left (typer's own
        handler exits 130 silently). Every input is checked by type first (formats/inputs.py)."""
        from cudasnap.formats.outputs import reset
        reset()
        why = special_input(ctx)
        if why:
            fail(why)
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
        """Every value checked before the command runs, each refusal one line as every other
        cudasnap error: an empty value, one outside the option's declared choices or range
        ('cudasnap: error: Invalid value for '--level': ...'), a number no option means, an
        Inert option given where it does nothing."""
        ctx.meta["cudasnap.args"] = list(args)          # replay --wrap re-executes these
        why = self.empty_value(ctx, args)
        if why:
            typer.echo(f"cudasnap: error: {why}", err=True)
            ctx.exit(2)
        try:
            rest = super().parse_args(ctx, args)
        except typer.BadParameter as e:
            typer.echo(f"cudasnap: error: {' '.join(e.format_message().split())}", err=True)
            ctx.exit(2)
        for p in self.params:
            why = number_problem(p, ctx.params.get(p.name))
            if why:
                typer.echo(f"cudasnap: error: {why}", err=True)
                ctx.exit(2)
        for msg, warn in inert_problems(ctx, getattr(self.callback, "cudasnap_inert", ())):
            typer.echo(f"cudasnap: {'warning' if warn else 'error'}: {msg}", err=True)
            if not warn:
                ctx.exit(2)
        return rest

    def empty_value(self, ctx, args) -> Optional[str]:
        """An option given an empty value (`-o ''`, `--calls=`): no option of cudasnap means
        anything by it (a path would become the working directory, a pattern would match all)."""
        takes = {}
        for p in self.params:
            if getattr(p, "param_type_name", "") == "option" and not getattr(p, "is_flag", False) and not p.count:
                for o in p.opts:
                    takes[o] = p
        i = 0
        while i < len(args):
            a = args[i]
            if a == "--":
                break
            name, eq, val = a.partition("=")
            if a in takes:
                if i + 1 < len(args) and not args[i + 1].strip():
                    return f"{'/'.join(takes[a].opts)} is empty: give {takes[a].metavar or 'a value'}"
                i += 2
                continue
            if eq and name in takes and not val.strip():
                return f"{'/'.join(takes[name].opts)} is empty: give {takes[name].metavar or 'a value'}"
            if not a.startswith("-") and not ctx.allow_interspersed_args:
                break                                   # capture: the program's own arguments follow
            i += 1
        return None


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
