"""The pytest plugin of sqsworker (registered by the package's ``pytest11`` entry point):
the ``sqsworker_harness`` fixture, a factory of ``sqsworker.testing.Harness`` closed when
the test ends.

    def test_an_order_is_processed(sqsworker_harness):
        harness = sqsworker_harness(app.process)
        ...
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from .testing import Harness


@pytest.fixture
def sqsworker_harness() -> Iterator[Callable[..., Harness]]:
    """``sqsworker_harness(handler, **options)``: a ``Harness`` of ``handler`` (options as
    ``Harness`` takes them), stopped after the test."""
    made: list[Harness] = []

    def make(handler: Any, **options: Any) -> Harness:
        harness = Harness(handler, **options)
        made.append(harness)
        return harness

    yield make
    for harness in made:
        harness.close()
