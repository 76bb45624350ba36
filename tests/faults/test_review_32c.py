"""Review 32c: an endpoint answering 200 ``{}`` (the fault proxy's ``empty``), beyond the
batch calls commit 75461ab covered: the queue check and the queue's counts."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sqsworker.errors import StartupError, TransportError
from sqsworker.local import LocalSQS
from sqsworker.transports.sqs import SQSTransport

from ..conftest import unique
from .proxy import FaultProxy

pytestmark = pytest.mark.integration

CLIENTS = ("boto3", "lean")


@pytest.fixture
def proxy(local_sqs: LocalSQS, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    for key, value in local_sqs.env().items():
        monkeypatch.setenv(key, value)
    made = FaultProxy(local_sqs.endpoint_url, seed=3).start()
    yield made
    made.stop()


@pytest.mark.parametrize("client", CLIENTS)
def test_a_queue_opened_by_url_through_an_answer_naming_nothing_is_one_clear_error(
    local_sqs: LocalSQS, proxy: FaultProxy, client: str
) -> None:
    """By name, a GetQueueUrl answered ``{}`` is now a StartupError (75461ab). By URL
    there is no GetQueueUrl: the GetQueueAttributes answered ``{}`` must be the same
    clear error, not a KeyError out of ``connect``."""
    url = local_sqs.create_queue(unique("review-32c-url"), max_receive_count=None)
    proxy.set(empty=1.0)
    with pytest.raises(StartupError):
        SQSTransport.connect(url, endpoint_url=proxy.url, attempts=1, sqs_client=client)


@pytest.mark.parametrize("client", CLIENTS)
def test_counts_answered_with_nothing_are_a_transport_error(
    local_sqs: LocalSQS, proxy: FaultProxy, client: str
) -> None:
    """``counts()`` answered ``{}``: a TransportError (what its callers catch: the burst
    receive thread, redrive, the Spark source), not a KeyError."""
    name = unique("review-32c-counts")
    local_sqs.create_queue(name, max_receive_count=None)
    transport = SQSTransport.connect(name, endpoint_url=proxy.url, attempts=1, sqs_client=client)
    proxy.set(empty=1.0)
    with pytest.raises(TransportError):
        transport.counts()
