from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sqsworker.local import LocalSQS

from .scenario import Scenario


@pytest.fixture
def local_env(local_sqs: LocalSQS, monkeypatch: pytest.MonkeyPatch) -> LocalSQS:
    """The embedded SQS, with this process's environment pointing at it."""
    for key, value in local_sqs.env().items():
        monkeypatch.setenv(key, value)
    return local_sqs


@pytest.fixture
def scenario(local_env: LocalSQS, tmp_path: Path) -> Iterator[Scenario]:
    made = Scenario(local_env, tmp_path)
    yield made
    made.close()
