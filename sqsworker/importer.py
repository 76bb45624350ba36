"""Resolve ``MODULE:ATTR`` strings with a clear sentence for every way they can fail."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import Any

from .errors import ImportStringError


def import_from_string(spec: str) -> Any:
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise ImportStringError(
            f"{spec!r} is not an import string: write MODULE:ATTR, for example 'app:process'"
        )
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # like `python -m`, find the user's modules in the current folder
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if module_name == missing or module_name.startswith(missing + "."):
            raise ImportStringError(
                f"no module named {module_name!r} was found (searched the current directory "
                f"{cwd} and the Python path): check the spelling or install the package"
            ) from None
        raise ImportStringError(_raised_inside(module_name, exc)) from None
    except ImportStringError:
        raise  # a handler refused as it was decorated: its sentence names it and says the fix
    except Exception as exc:
        raise ImportStringError(_raised_inside(module_name, exc)) from None

    obj: Any = module
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            own = [
                name
                for name, value in vars(module).items()
                if callable(value)
                and not name.startswith("_")
                and getattr(value, "__module__", None) == module.__name__
            ]
            hint = f" (its functions: {', '.join(sorted(own)[:10])})" if own else ""
            raise ImportStringError(
                f"module {module_name!r} has no attribute {attr_path!r}{hint}"
            ) from None
    return obj


def import_exception(spec: str) -> type[BaseException]:
    obj = import_from_string(spec)
    if not (isinstance(obj, type) and issubclass(obj, BaseException)):
        raise ImportStringError(f"{spec!r} is not an exception class")
    return obj


def _raised_inside(module_name: str, exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    user_frames = [f for f in frames if "importlib" not in f.filename]
    where = f" at {user_frames[-1].filename}:{user_frames[-1].lineno}" if user_frames else ""
    if isinstance(exc, SyntaxError):  # raised by the compiler: no frame of the file itself
        where = ""  # its message names the file and the line
    return (
        f"importing module {module_name!r} failed: {type(exc).__name__}: {exc}{where}; "
        "the module was found, so fix the error inside it"
    )
