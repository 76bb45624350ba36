"""Resolve ``MODULE:ATTR`` strings with a clear sentence for every way they can fail."""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import traceback
from pathlib import PurePath
from typing import Any

from .errors import ImportStringError


def import_from_string(spec: str, *, kind: str = "attribute") -> Any:
    """The object ``spec`` (``MODULE:ATTR``) names. ``kind`` is what it should be
    ("attribute", or "exception class": a missing one is then looked for among the
    module's exception classes, not its functions)."""
    refuse_a_path(spec)
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
            hint = _nearest(module, attr_path, kind) if obj is module else ""
            raise ImportStringError(
                f"module {module_name!r} has no {kind} {attr_path!r}{hint}"
            ) from None
    return obj


def import_exception(spec: str) -> type[BaseException]:
    obj = import_from_string(spec, kind="exception class")
    if not (isinstance(obj, type) and issubclass(obj, BaseException)):
        raise ImportStringError(f"{spec!r} is not an exception class")
    return obj


def _nearest(module: Any, missing: str, kind: str) -> str:
    """The end of the sentence saying ``missing`` is not in ``module``: the name nearest
    it (among the module's exception classes for an exception class, else among the
    functions and classes defined in the module), or a few of those names."""
    if kind == "exception class":
        names = [
            name
            for name, value in vars(module).items()
            if isinstance(value, type) and issubclass(value, BaseException)
        ]
        listed = "its exception classes"
    else:
        names = [
            name
            for name, value in vars(module).items()
            if callable(value) and getattr(value, "__module__", None) == module.__name__
        ]
        listed = "its functions"
    names = sorted(n for n in names if not n.startswith("_"))
    near = difflib.get_close_matches(missing, names, n=1, cutoff=0.6)
    if near:
        return f": did you mean {module.__name__}:{near[0]}?"
    if not names:
        return " (it holds none)" if kind == "exception class" else ""
    return f" ({listed}: {', '.join(names[:10])}{', ...' if len(names) > 10 else ''})"


def refuse_a_path(target: str) -> None:
    """Raise ``ImportStringError`` if ``target`` (``MODULE:ATTR`` or ``MODULE``) names a
    file (``app.py:process``, ``src/app.py``) where a module belongs, with the module
    string meant; a path is never imported (importing ``app.py`` would run ``app``)."""
    module_name, sep, attr = target.partition(":")
    if not (module_name.endswith(".py") or "/" in module_name or os.sep in module_name):
        return
    path = PurePath(module_name)
    stem = path.with_suffix("") if path.suffix == ".py" else path
    rest = f"{sep}{attr}"
    if (
        not path.is_absolute()
        and ".." not in path.parts
        and all(part.isidentifier() for part in stem.parts)
    ):
        dotted = ".".join(stem.parts)
        if len(stem.parts) == 1:
            meant = f"{dotted}{rest} (run from the folder that holds {path.name})"
        else:
            meant = f"{dotted}{rest} (or {stem.name}{rest} with PYTHONPATH={stem.parent})"
    else:
        meant = f"{stem.name}{rest}, with PYTHONPATH={stem.parent}"
    raise ImportStringError(
        f"{target!r} names a file, and sqsworker imports a module, as python -m does: "
        f"did you mean {meant}?"
    )


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
