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

import inspect
import logging
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .message import Message
from .parsing import is_model, parser, type_name

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
            f"handler {name} takes its body as {body.name} ({type_name(hints[body.name])}) "
            f"and also {', '.join(extra)}, which nothing gives: its other parameter may only "
            "be the message (annotated sqsworker.Message, or named message)"
        )
    model = hints[body.name]
    return Typed(model, parser(model), body.name, message.name if message else None)
