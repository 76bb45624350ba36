"""A JSON body parsed into a model and validated: pydantic's own validation for a pydantic
model (an extra: ``sqsworker[pydantic]``); for dataclasses and TypedDicts, required fields
and the basic types (str, int, float, bool, lists, dicts, ``Optional``, nested dataclasses
and TypedDicts; other annotations are taken as they come). A body that does not validate
raises ``MessageValidationError`` (a ``Reject``) naming the field paths and reasons, never
the body's values. ``typed.py`` gives handlers their parsed bodies; ``Message.parse`` uses
this directly.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from .errors import MessageValidationError


def is_model(annotation: object) -> bool:
    """True for a pydantic model class, a dataclass or a TypedDict."""
    if not isinstance(annotation, type):
        return False
    return (
        _is_pydantic(annotation)
        or dataclasses.is_dataclass(annotation)
        or typing.is_typeddict(annotation)
    )


def parser(model: Any) -> Callable[[str, str], Any]:
    """(body, message id) -> the body as ``model``; raises ``MessageValidationError``."""
    if _is_pydantic(model):
        return _pydantic_parser(model)

    def parse(body: str, message_id: str) -> Any:
        try:
            value = json.loads(body)
        except (ValueError, RecursionError) as exc:
            what = "is not JSON" if isinstance(exc, ValueError) else "nests JSON too deep"
            raise MessageValidationError(
                f"message {message_id} has a body that {what}, so it cannot be a "
                f"{type_name(model)}",
                [f"(body): {what}"],
            ) from None
        errors = check(value, model, "")
        if errors:
            raise _invalid(message_id, model, errors)
        return build(value, model)

    return parse


def check(value: Any, annotation: Any, path: str) -> list[str]:
    """Why ``value`` (decoded JSON) is not an ``annotation``, as "path: reason" lines."""
    where = path or "(body)"
    if annotation is Any or annotation is object:
        return []
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        branches = [check(value, branch, path) for branch in arguments]
        if any(not errors for errors in branches):
            return []
        return [f"{where}: must be {type_name(annotation)}"]
    if annotation is type(None):
        return [] if value is None else [f"{where}: must be null"]
    if annotation is bool:
        return [] if isinstance(value, bool) else [f"{where}: must be a boolean"]
    if annotation is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else [f"{where}: must be a whole number"]
    if annotation is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        return [] if ok else [f"{where}: must be a number"]
    if annotation is str:
        return [] if isinstance(value, str) else [f"{where}: must be a string"]
    if annotation in (list, tuple) or origin in (list, tuple, typing.Sequence):
        if not isinstance(value, list):
            return [f"{where}: must be a list"]
        if not arguments:
            return []
        item = arguments[0]
        return [e for i, v in enumerate(value) for e in check(v, item, f"{path}[{i}]")]
    if annotation is dict or origin in (dict, typing.Mapping, Mapping):
        if not isinstance(value, dict):
            return [f"{where}: must be an object"]
        if len(arguments) != 2:
            return []
        return [e for k, v in value.items() for e in check(v, arguments[1], _join(path, k))]
    if isinstance(annotation, type) and (
        dataclasses.is_dataclass(annotation) or typing.is_typeddict(annotation)
    ):
        if not isinstance(value, dict):
            return [f"{where}: must be an object ({annotation.__name__})"]
        errors = []
        for field, (field_type, required) in _fields(annotation).items():
            if field not in value:
                if required:
                    errors.append(f"{_join(path, field)}: field required")
                continue
            errors += check(value[field], field_type, _join(path, field))
        return errors
    return []  # an annotation of its own (datetime, Literal, ...): pydantic validates those


def build(value: Any, annotation: Any) -> Any:
    """``value`` (checked) as ``annotation``: dataclasses made, nested ones too."""
    origin = typing.get_origin(annotation)
    arguments = typing.get_args(annotation)
    if origin is typing.Union or origin is types.UnionType:
        for branch in arguments:
            if not check(value, branch, ""):
                return build(value, branch)
        return value
    if isinstance(value, list) and arguments and (origin in (list, typing.Sequence)):
        return [build(v, arguments[0]) for v in value]
    if isinstance(value, dict) and isinstance(annotation, type):
        if dataclasses.is_dataclass(annotation):
            fields = _fields(annotation)
            known = {k: build(v, fields[k][0]) for k, v in value.items() if k in fields}
            return annotation(**known)
        if typing.is_typeddict(annotation):
            fields = _fields(annotation)
            return {k: build(v, fields[k][0]) if k in fields else v for k, v in value.items()}
    return value


def _fields(annotation: type) -> dict[str, tuple[Any, bool]]:
    """A dataclass's or TypedDict's fields: name -> (type, required)."""
    hints = typing.get_type_hints(annotation)
    if dataclasses.is_dataclass(annotation):
        return {
            f.name: (
                hints.get(f.name, Any),
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
            )
            for f in dataclasses.fields(annotation)
            if f.init
        }
    required = getattr(annotation, "__required_keys__", frozenset(hints))
    return {name: (hint, name in required) for name, hint in hints.items()}


def _is_pydantic(annotation: object) -> bool:
    return isinstance(annotation, type) and callable(
        getattr(annotation, "model_validate_json", None)
    )


def _pydantic_parser(model: Any) -> Callable[[str, str], Any]:
    from pydantic import ValidationError

    def parse(body: str, message_id: str) -> Any:
        try:
            return model.model_validate_json(body)
        except ValidationError as exc:
            errors = [
                f"{'.'.join(str(part) for part in error['loc']) or '(body)'}: {error['msg']}"
                for error in exc.errors(include_input=False, include_url=False)
            ]
            raise _invalid(message_id, model, errors) from None

    return parse


def _invalid(message_id: str, model: Any, errors: list[str]) -> MessageValidationError:
    shown = "; ".join(errors[:10]) + (f"; and {len(errors) - 10} more" if len(errors) > 10 else "")
    return MessageValidationError(
        f"message {message_id} has a body that is not a valid {type_name(model)}: {shown}",
        errors,
    )


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")
