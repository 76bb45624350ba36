"""Fault-injection scenarios: what each one did is reported at the end of the run."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sqsworker.local import LocalSQS

from ..conftest import FAULT_REPORT
from ..integration.conftest import local_env as local_env
from ..integration.scenario import Scenario


@pytest.fixture
def report(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Record one line about the scenario's outcome for the run's closing summary
    (tests/conftest.py prints it)."""
    return lambda line: request.node.user_properties.append((FAULT_REPORT, line))


@pytest.fixture
def soak(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--soak"))


@pytest.fixture
def scenario(local_env: LocalSQS, tmp_path: Path) -> Iterator[Scenario]:
    made = Scenario(local_env, tmp_path, visibility=5, max_receive_count=10)
    yield made
    made.close()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--soak"):  # minutes of chaos, past the suite's per-test timeout
        for item in items:
            if "tests/faults/" in item.nodeid:
                item.add_marker(pytest.mark.timeout(1800))
