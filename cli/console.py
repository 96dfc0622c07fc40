"""The console helpers, for the command line: defined in formats/console.py, below every layer."""
from cudasnap.formats.console import Column, console, is_tty, print_table  # noqa: F401
