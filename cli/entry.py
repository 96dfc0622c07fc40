"""The `cudasnap` script and `python -m cudasnap`: the termination rule holds from the first
instant (a signal while the command line is still being imported ends it with its line too),
then the command line (cli.py)."""
from __future__ import annotations

from cudasnap.exits import finish, hold_std_fds, leave, report_interrupt, reported


def main() -> None:
    from cudasnap.formats import signals
    hold_std_fds()
    try:
        signals.install()
        from cudasnap.cli import main as cli_main
        cli_main()
    except KeyboardInterrupt as e:
        leave(finish(signals.exit_code() if reported() else report_interrupt(e)))
