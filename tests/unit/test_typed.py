"""Typed handlers: what a signature means, and the validation of dataclasses and
TypedDicts without pydantic (pydantic's own is its own; test_typed in integration runs a
model end to end)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional, TypedDict

import pydantic
import pytest

import sqsworker
from sqsworker.errors import HandlerShapeError, MessageValidationError
from sqsworker.parsing import check
from sqsworker.testing import Harness


@dataclasses.dataclass
class Line:
    sku: str
    qty: int = 1


@dataclasses.dataclass
class Cart:
    id: str
    lines: list[Line]
    total: float
    paid: bool
    tags: dict[str, str]
    note: Optional[str] = None  # noqa: UP045 - Optional as users write it


class Event(TypedDict):
    kind: str
    n: int


class Payment(pydantic.BaseModel):
    id: str
    cents: int


CART = {"id": "c1", "lines": [{"sku": "a"}], "total": 3, "paid": False, "tags": {}}


@pytest.mark.parametrize(
    ("body", "errors"),
    [
        (CART, []),
        ({**CART, "note": None}, []),
        ({**CART, "total": 2.5, "note": "gift"}, []),
        ({**CART, "lines": [{"qty": 2}]}, ["lines[0].sku: field required"]),
        ({**CART, "lines": [{"sku": "a", "qty": True}]}, ["lines[0].qty: must be a whole number"]),
        ({**CART, "total": "3"}, ["total: must be a number"]),
        ({**CART, "paid": 0}, ["paid: must be a boolean"]),
        ({**CART, "tags": {"a": 1}}, ["tags.a: must be a string"]),
        ({**CART, "note": 5}, ["note: must be Optional[str]"]),
        (
            {"lines": "x"},
            [
                "id: field required",
                "lines: must be a list",
                "total: field required",
                "paid: field required",
                "tags: field required",
            ],
        ),
        ([1], ["(body): must be an object (Cart)"]),
    ],
)
def test_a_dataclass_body_is_checked_field_by_field(body: Any, errors: list[str]) -> None:
    assert check(body, Cart, "") == errors


def test_a_typed_dict_checks_required_keys_and_types() -> None:
    assert check({"kind": "k", "n": 1}, Event, "") == []
    assert check({"kind": 1}, Event, "") == ["kind: must be a string", "n: field required"]


def test_the_body_and_the_message_are_given_by_annotation_or_name() -> None:
    seen: list[Any] = []

    @sqsworker.handler(queue="carts")
    def process(cart: Cart, message: sqsworker.Message) -> None:
        seen.append((cart, message.message_id))

    @sqsworker.handler(queue="events")
    def events(msg: sqsworker.Message, event: Event) -> None:
        seen.append((event, msg.message_id))

    process(sqsworker.Message.build(CART, message_id="m-1"))
    events(sqsworker.Message.build({"kind": "k", "n": 2}, message_id="m-2"))
    cart, first = seen[0]
    assert isinstance(cart, Cart) and cart.lines == [Line("a", 1)] and first == "m-1"
    assert seen[1] == ({"kind": "k", "n": 2}, "m-2")


def test_a_body_that_does_not_validate_raises_a_rejection_naming_fields_not_values() -> None:
    @sqsworker.handler(queue="payments")
    def pay(payment: Payment) -> None:
        raise AssertionError("never run")

    with pytest.raises(MessageValidationError) as refused:
        pay(sqsworker.Message.build({"id": "p-1", "cents": "twelve-secret"}))
    assert isinstance(refused.value, sqsworker.Reject)
    assert refused.value.errors == [
        "cents: Input should be a valid integer, unable to parse string as an integer"
    ]
    assert "twelve-secret" not in str(refused.value)


def test_a_second_parameter_nothing_gives_is_refused_at_decoration() -> None:
    with pytest.raises(HandlerShapeError, match="also extra, which nothing gives"):

        @sqsworker.handler(queue="carts")
        def process(cart: Cart, extra: int) -> None: ...


def test_annotations_that_cannot_be_resolved_keep_the_message_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def process(message: "NotImported") -> None:  # type: ignore[name-defined]  # noqa: F821, UP037
        seen.append(message)

    seen: list[Any] = []
    with caplog.at_level(logging.WARNING, logger="sqsworker"):
        handler = sqsworker.handler(queue="q")(process)
    assert "annotations that cannot be resolved (NameError" in caplog.text
    message = sqsworker.Message.build("{}")
    handler(message)
    assert seen == [message]


def test_other_annotations_keep_their_meaning() -> None:
    @sqsworker.handler(queue="q")
    def plain(message: sqsworker.Message) -> None: ...

    @sqsworker.handler(queue="q")
    def bare(message) -> None: ...  # type: ignore[no-untyped-def]

    assert plain.typed is None and bare.typed is None


def test_a_batch_handler_parses_each_message_itself() -> None:
    totals: list[int] = []

    @sqsworker.batch_handler(queue="payments", batch_size=5)
    def pay(messages: list[sqsworker.Message]) -> sqsworker.BatchResult:
        failed = {}
        for message in messages:
            try:
                totals.append(message.parse(Payment).cents)
            except sqsworker.Reject as exc:
                failed[message] = exc
        return sqsworker.BatchResult(failed)

    with Harness(pay) as harness:
        for body in ({"id": "a", "cents": 1}, {"id": "b"}, {"id": "c", "cents": 3}):
            harness.send(body)
        harness.drain()
        (letter,) = harness.dead_letters
    assert sorted(totals) == [1, 3]
    assert "cents: Field required" in letter.reason


def test_the_handlers_page_typed_example_runs_as_written(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """docs/handlers.md: shop.py's typed handlers, a valid and an invalid body each."""
    from ..snippets import snippet

    (tmp_path / "shop.py").write_text(snippet("docs/handlers.md", "# shop.py").text)
    monkeypatch.syspath_prepend(str(tmp_path))
    import shop  # type: ignore[import-not-found]

    with Harness(shop.place) as harness:
        harness.send({"id": "o-1", "total_cents": 1200})
        harness.send({"id": "o-2"})
        harness.drain()
        (letter,) = harness.dead_letters
    assert "is not a valid Order: total_cents: Field required" in letter.reason
    with Harness(shop.refund) as harness:
        harness.send({"order_id": "o-1"})
        harness.send({"reason": "late"})
        harness.drain()
        (letter,) = harness.dead_letters
    assert "is not a valid Refund: order_id: field required" in letter.reason
    out = capsys.readouterr().out
    assert "placing o-1 1200" in out and "refunding o-1 received 1 times" in out
