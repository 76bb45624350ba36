"""Typed messages: a handler's parameter annotated with a pydantic model, a dataclass or a
``TypedDict`` is given the body parsed from JSON and validated.

``plan(func)`` reads a handler's signature once, at decoration: the parameter that takes
the body, and the one (annotated ``Message``, or named ``message``) that takes the message
itself. Every other handler keeps its meaning (one ``Message``). ``parser(model)`` is the
validation: pydantic's own for a model (pydantic is an extra: ``sqsworker[pydantic]``);
for dataclasses and TypedDicts, required fields and the basic types (str, int, float,
bool, lists, dicts, ``Optional``, nested dataclasses and TypedDicts; other annotations
are taken as they come). A body that does not validate raises ``MessageValidationError``,
a ``Reject``: it goes to the dead-letter queue at its first receive, the handler unrun,
with the field paths and reasons (never the body's values) as the reason.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import MessageValidationError

log = logging.getLogger("sqsworker")
_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


@dataclass(frozen=True)
class Typed:
    """How to call a typed handler: ``body`` takes the parsed body, ``message`` (if any)
    the message."""

    model: Any
    parse: Callable[[str, str], Any]  # (body, message id) -> the value, or raises
    body: str
    message: str | None

    def arguments(self, message: Any) -> dict[str, Any]:
        arguments = {self.body: self.parse(message.body, message.message_id)}
        if self.message is not None:
            arguments[self.message] = message
        return arguments


def plan(func: Callable[..., object], name: str) -> Typed | str | None:
    """The typed call of ``func``; None when it takes a ``Message`` as before; a sentence
    when its signature cannot work (a second parameter that is not the message)."""
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return None
    parameters = [p for p in signature.parameters.values() if p.kind in _POSITIONAL]
    if not parameters or all(p.annotation is inspect.Parameter.empty for p in parameters):
        return None
    runs = func if inspect.isroutine(func) else type(func).__call__
    try:
        hints = typing.get_type_hints(runs)
    except Exception as exc:  # a name the annotations use is not importable where they are
        log.warning(
            "handler %s has annotations that cannot be resolved (%s: %s): it is given the "
            "Message, as a handler without a model is",
            name,
            type(exc).__name__,
            exc,
        )
        return None
    body = next((p for p in parameters if is_model(hints.get(p.name))), None)
    if body is None:
        return None
    from .message import Message

    message = next(
        (
            p
            for p in parameters
            if p is not body and (hints.get(p.name) is Message or p.name == "message")
        ),
        None,
    )
    extra = [
        p.name
        for p in parameters
        if p is not body and p is not message and p.default is inspect.Parameter.empty
    ]
    if extra:
        return (
            f"handler {name} takes its body as {body.name} ({_type_name(hints[body.name])}) "
            f"and also {', '.join(extra)}, which nothing gives: its other parameter may only "
            "be the message (annotated sqsworker.Message, or named message)"
        )
    model = hints[body.name]
    return Typed(model, parser(model), body.name, message.name if message else None)


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
                f"{_type_name(model)}",
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
        return [f"{where}: must be {_type_name(annotation)}"]
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
        f"message {message_id} has a body that is not a valid {_type_name(model)}: {shown}",
        errors,
    )


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")
