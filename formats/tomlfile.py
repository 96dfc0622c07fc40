"""Read a TOML file the command line was given (ENVS.toml, a campaign file), every failure as
one line: TomlFileError(message naming the file)."""
from __future__ import annotations

from typing import Any, Dict


class TomlFileError(Exception):
    """A TOML file that cannot be read (one line)."""


def load_toml(path: str, what: str = "TOML file") -> Dict[str, Any]:
    try:
        import tomllib  # Python 3.11+
    except ModuleNotFoundError:
        try:
            import tomli as tomllib  # type: ignore
        except ModuleNotFoundError:
            raise TomlFileError(f"reading a {what} needs Python 3.11+ (tomllib) or the tomli package: pip install tomli")
    from .inputs import input_problem
    why = input_problem(path)
    if why:
        raise TomlFileError(why)
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise TomlFileError(f"{path}: no such file")
    except IsADirectoryError:
        raise TomlFileError(f"{path} is a directory: give the {what}")
    except OSError as e:
        raise TomlFileError(f"{path}: {e.strerror or e}")
    except tomllib.TOMLDecodeError as e:
        raise TomlFileError(f"{path}: not valid TOML: {e}")
    except UnicodeDecodeError:
        raise TomlFileError(f"{path}: not valid TOML: not UTF-8 text")
    except RecursionError:
        raise TomlFileError(f"{path}: not valid TOML: nested too deeply")
