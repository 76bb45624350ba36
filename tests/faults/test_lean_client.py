"""The lean client of the hot calls (transports/lean.py) against botocore's, at moto's
server behind the fault proxy: every fault and every refusal must leave the transport as
the same sqsworker error (code, retryable), and credentials are frozen afresh for each
request, so refreshed ones are used as botocore would use them."""

from __future__ import annotations

import datetime
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sqsworker.errors import CredentialsError, StartupError, TransportError
from sqsworker.local import LocalSQS
from sqsworker.transports import UNANSWERED, OutgoingMessage
from sqsworker.transports.sqs import SQSTransport

from ..conftest import unique
from .proxy import FaultProxy

pytestmark = pytest.mark.integration

CLIENTS = ("boto3", "lean")

Call = Callable[[SQSTransport], object]
CALLS: dict[str, Call] = {
    "ReceiveMessage": lambda q: q.receive(10, 0, 30),
    "DeleteMessageBatch": lambda q: q.delete_batch([("a", "not-a-handle")]),
    "ChangeMessageVisibilityBatch": lambda q: q.change_visibility_batch([("a", "x", 5)]),
    "SendMessageBatch": lambda q: q.send_batch([OutgoingMessage("hello")]),
}


@pytest.fixture
def proxy(local_sqs: LocalSQS, monkeypatch: pytest.MonkeyPatch) -> Iterator[FaultProxy]:
    for key, value in local_sqs.env().items():
        monkeypatch.setenv(key, value)
    made = FaultProxy(local_sqs.endpoint_url, seed=3).start()
    yield made
    made.stop()


def outcome(transport: SQSTransport, call: Call) -> tuple[str, str, bool]:
    """What a call left the transport as: ("ok", "", False) or the error's type, code and
    whether it is retryable."""
    try:
        call(transport)
    except TransportError as exc:
        return type(exc).__name__, exc.code, exc.retryable
    return "ok", "", False


def connect(queue: str, url: str, client: str) -> SQSTransport:
    transport = SQSTransport.connect(queue, endpoint_url=url, attempts=1, sqs_client=client)
    assert (transport.lean is not None and transport.lean.ready) == (client == "lean")
    return transport


@pytest.mark.parametrize("fault", ["throttle", "unavailable", "bad_gateway", "reset"])
def test_a_fault_leaves_each_hot_call_as_the_same_error_on_both_clients(
    local_sqs: LocalSQS, proxy: FaultProxy, fault: str
) -> None:
    queue = unique("lean-faults")
    local_sqs.create_queue(queue, max_receive_count=None)
    transports = {c: connect(queue, proxy.url, c) for c in CLIENTS}
    lean = transports["lean"].lean
    assert lean is not None and lean.wire is not None  # connections of its own
    proxy.set(**{fault: 1.0})
    for action, call in CALLS.items():
        seen = {client: outcome(transports[client], call) for client in CLIENTS}
        assert seen["lean"] == seen["boto3"], (action, seen)
        assert seen["lean"][0] == "TransportError" and seen["lean"][2], (action, seen)
    assert proxy.injected[fault] == 2 * len(CALLS)


def test_a_query_error_header_names_the_code_alike_on_both_clients(
    local_sqs: LocalSQS, proxy: FaultProxy
) -> None:
    """SQS's refusals carry the query protocol's code in x-amzn-query-error: botocore's
    parser takes it over the JSON's __type, from the lean client's headers as from its own
    (a header the endpoint spells in any case), and the connection carries the next call."""
    queue = unique("lean-query-error")
    local_sqs.create_queue(queue, max_receive_count=None)
    transports = {c: connect(queue, proxy.url, c) for c in CLIENTS}
    proxy.set(query_error=1.0)
    for action, call in CALLS.items():
        seen = {client: outcome(transports[client], call) for client in CLIENTS}
        assert seen["lean"] == seen["boto3"], (action, seen)
        assert seen["lean"] == ("TransportError", "NonExistentQueue", False), (action, seen)
    proxy.set()
    assert outcome(transports["lean"], CALLS["ReceiveMessage"]) == ("ok", "", False)
    lean = transports["lean"].lean
    assert lean is not None and lean.wire is not None and lean.wire.opened == 1


def test_refusals_leave_each_hot_call_as_the_same_error_on_both_clients(
    local_sqs: LocalSQS, proxy: FaultProxy
) -> None:
    """moto's own refusals (a handle it never gave, a queue deleted under the transport):
    botocore's parser reads them for both clients."""
    queue = unique("lean-refusals")
    local_sqs.create_queue(queue, max_receive_count=None)
    transports = {c: connect(queue, proxy.url, c) for c in CLIENTS}
    delete = CALLS["DeleteMessageBatch"]
    seen = {client: outcome(transports[client], delete) for client in CLIENTS}
    assert seen["lean"] == seen["boto3"]
    answers = {c: transports[c].change_visibility_batch([("a", "x", 5)]) for c in CLIENTS}
    failed = {c: [(f.id, f.code, f.sender_fault) for f in answers[c].failed] for c in CLIENTS}
    assert failed["lean"] == failed["boto3"]
    transports["boto3"].request("DeleteQueue", QueueUrl=transports["boto3"].info.url)
    for action, call in CALLS.items():
        seen = {client: outcome(transports[client], call) for client in CLIENTS}
        assert seen["lean"] == seen["boto3"], (action, seen)
        assert seen["lean"][1] in ("QueueDoesNotExist", "NonExistentQueue"), (action, seen)


def test_refreshed_credentials_sign_the_next_request(
    local_sqs: LocalSQS, proxy: FaultProxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Credentials from botocore's provider chain (here a credential_process whose keys
    expire within botocore's refresh window, so every use refreshes them) are frozen
    afresh for every lean request: each request is signed with the key of its time."""
    queue = unique("lean-credentials")
    local_sqs.create_queue(queue, max_receive_count=None)  # before the profile is set
    counter = tmp_path / "count"
    counter.write_text("0")
    script = tmp_path / "credentials.py"
    expiry = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(minutes=5)).isoformat()
    script.write_text(
        "import json, pathlib\n"
        f"p = pathlib.Path({str(counter)!r})\n"
        "n = int(p.read_text()) + 1\n"
        "p.write_text(str(n))\n"
        "print(json.dumps({'Version': 1, 'AccessKeyId': f'KEY{n}', "
        f"'SecretAccessKey': 'secret', 'Expiration': {expiry!r}}}))\n"
    )
    config = tmp_path / "config"
    config.write_text(
        f"[profile refreshing]\ncredential_process = {sys.executable} {script}\n"
        "region = us-east-1\n"
    )
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_PROFILE", "refreshing")
    transport = connect(queue, proxy.url, "lean")
    proxy.access_keys.clear()
    for _ in range(3):
        transport.send_batch([OutgoingMessage("hello")])
    used = int(counter.read_text())
    # three requests, each signed with a key vended for it (and none signed with an old one)
    assert len(proxy.access_keys) == 3 and all(n == 1 for n in proxy.access_keys.values())
    assert set(proxy.access_keys) <= {f"KEY{n}" for n in range(1, used + 1)}
    assert f"KEY{used}" in proxy.access_keys


def test_a_reopened_transport_sends_and_receives_lean(
    local_sqs: LocalSQS, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transport reopened without a call (a copy in another process) is lean at once:
    what it sends it receives."""
    for key, value in local_sqs.env().items():
        monkeypatch.setenv(key, value)
    queue = unique("lean-reopen")
    local_sqs.create_queue(queue, max_receive_count=None)
    info = SQSTransport.connect(queue, endpoint_url=local_sqs.endpoint_url).info
    copy = SQSTransport.reopen(info, endpoint_url=local_sqs.endpoint_url)
    assert copy.lean is not None and copy.lean.ready
    copy.send_batch([OutgoingMessage("one")])
    copy.send_batch([OutgoingMessage("two")])
    bodies = sorted(m.body for m in copy.receive(10, 1, 30))
    assert bodies == ["one", "two"], json.dumps(bodies)
    assert copy.requests == {"SendMessageBatch": 2, "ReceiveMessage": 1}
    copy.close()


def test_a_garbled_answer_is_a_retryable_fault_on_the_lean_client(
    local_sqs: LocalSQS, proxy: FaultProxy
) -> None:
    """A 200 whose body is not JSON (a captive portal, a broken proxy): botocore's parser
    reads it as an empty answer (no messages; a batch with no entry settled, none
    failed); the lean client calls it what it is, a fault on the way, retried like a
    reset."""
    queue = unique("lean-garbled")
    local_sqs.create_queue(queue, max_receive_count=None)
    lean, plain = connect(queue, proxy.url, "lean"), connect(queue, proxy.url, "boto3")
    proxy.set(garbled=1.0)
    for action, call in CALLS.items():
        assert outcome(lean, call) == ("TransportError", "ConnectionError", True), action
    assert plain.receive(10, 0, 30) == []
    deleted = plain.delete_batch([("a", "h")])  # no JSON, so no entry named: not done
    assert deleted.succeeded == [] and [f.id for f in deleted.failed] == ["a"]
    assert deleted.failed[0].code == UNANSWERED


def test_an_answer_that_names_no_entry_fails_each_entry_alike_on_both_clients(
    local_sqs: LocalSQS, proxy: FaultProxy
) -> None:
    """A 200 that names an entry neither successful nor failed (here ``{}``) leaves that
    entry failed, SQS's fault (tried again), on both clients: a delete, renewal or send
    taken as done would run a message again, let its lease lapse unseen, or lose it."""
    queue = unique("lean-unanswered")
    local_sqs.create_queue(queue, max_receive_count=None)
    transports = {c: connect(queue, proxy.url, c) for c in CLIENTS}
    proxy.set(empty=1.0)
    for client, transport in transports.items():
        results = [
            transport.delete_batch([("a", "h1"), ("b", "h2")]),
            transport.change_visibility_batch([("a", "h1", 5), ("b", "h2", 5)]),
            transport.send_batch([OutgoingMessage("one"), OutgoingMessage("two")]),
        ]
        for result, ids in zip(results, [["a", "b"], ["a", "b"], ["0", "1"]], strict=True):
            assert result.succeeded == [] and result.message_ids == {}, client
            failed = [(f.id, f.code, f.sender_fault, f.lease_lost) for f in result.failed]
            assert failed == [(i, UNANSWERED, False, False) for i in ids], client
    assert proxy.injected["empty"] == 3 * len(CLIENTS)


def test_an_odd_batch_answer_is_read_for_the_call_s_own_entries_on_both_clients(
    local_sqs: LocalSQS, proxy: FaultProxy
) -> None:
    """An answer naming an entry the call did not make, one entry twice, or both
    successful and failed, or holding entries that are no object: the entries of other
    ids are not read (a producer indexing its batch by them raised IndexError), and one
    named both ways may have been acted on or not, so it fails as not answered (tried
    again), never counted done."""
    queue = unique("lean-odd")
    local_sqs.create_queue(queue, max_receive_count=None)
    for client in CLIENTS:
        transport = connect(queue, proxy.url, client)
        proxy.set(odd=True)
        sent = transport.send_batch([OutgoingMessage("one"), OutgoingMessage("two")])
        assert sent.succeeded == ["1"] and list(sent.message_ids) == ["1"], client
        assert [(f.id, f.code) for f in sent.failed] == [("0", UNANSWERED)], client
        proxy.set()
        held = transport.receive(10, 1, 30)
        assert sorted(m.body for m in held) == ["one", "two"], client  # both went
        proxy.set(odd=True)
        entries = [(str(i), m.receipt_handle) for i, m in enumerate(held)]
        renewed = transport.change_visibility_batch([(i, h, 30) for i, h in entries])
        deleted = transport.delete_batch(entries)
        for result in (renewed, deleted):
            assert result.succeeded == ["1"], client
            assert [(f.id, f.code, f.sender_fault) for f in result.failed] == [
                ("0", UNANSWERED, False)
            ], client
        proxy.set()
        transport.delete_batch(entries[:1])  # the one not counted done, tried again
        assert transport.counts().total == 0, client
    assert proxy.injected["odd"] == 3 * len(CLIENTS)


def test_a_batch_answer_in_no_shape_sqs_gives_is_a_retryable_fault_on_both_clients(
    local_sqs: LocalSQS, proxy: FaultProxy
) -> None:
    """A batch answer holding entries that are no object, or an Id that is no text:
    botocore's parser raised AttributeError (out of the producer, to the user's code);
    now, on both clients, the call fails as not answered (SQS may have acted), retried."""
    queue = unique("lean-malformed")
    local_sqs.create_queue(queue, max_receive_count=None)
    proxy.set(malformed=True)
    for client in CLIENTS:
        transport = connect(queue, proxy.url, client)
        for action, call in CALLS.items():
            if action != "ReceiveMessage":
                assert outcome(transport, call) == ("TransportError", UNANSWERED, True), action
    assert proxy.injected["malformed"] == 3 * len(CLIENTS)


def test_both_clients_go_through_the_proxy_the_environment_names(
    local_sqs: LocalSQS, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HTTP_PROXY (HTTPS_PROXY for https endpoints) is botocore's to honour, for the lean
    client's requests too: they go out through the same session. Here the fault proxy
    stands as the forward proxy in front of moto's server."""
    queue = unique("lean-proxied")
    local_sqs.create_queue(queue, max_receive_count=None)
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    for name in ("NO_PROXY", "no_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    for client in CLIENTS:
        transport = connect(queue, local_sqs.endpoint_url, client)
        before = proxy.forwarded
        transport.send_batch([OutgoingMessage(client)])
        [message] = transport.receive(10, 1, 30)
        transport.delete_batch([("a", message.receipt_handle)])
        assert message.body == client
        assert proxy.forwarded - before == 3, client
        if transport.lean is not None:  # through botocore's session, not connections of its own
            assert transport.lean.wire is None


@pytest.mark.parametrize("client", ["lean", "boto3"])
def test_the_worker_uses_the_client_its_sqs_client_option_names(
    local_sqs: LocalSQS, monkeypatch: pytest.MonkeyPatch, client: str
) -> None:
    from sqsworker import Worker, WorkerConfig

    for key, value in local_sqs.env().items():
        monkeypatch.setenv(key, value)
    name = unique("client")
    local_sqs.create_queue(name, max_receive_count=None)
    worker = Worker(lambda message: None, WorkerConfig(queue=name, sqs_client=client))
    worker.start()
    try:
        transport = worker.transport
        assert isinstance(transport, SQSTransport)
        assert (transport.lean is not None) == (client == "lean")
    finally:
        worker.request_stop()
        assert worker.shutdown() == 0


def test_a_reopened_transport_is_lean_from_its_first_call_without_a_request_of_its_own(
    local_sqs: LocalSQS, proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A copy of a transport in another process (a Spark task) learns where and how to send
    from a request botocore signs but does not send: no request, and its first receive
    goes out lean, on a connection of its own."""
    queue = unique("lean-reopened")
    local_sqs.create_queue(queue, max_receive_count=None)
    info = connect(queue, local_sqs.endpoint_url, "lean").info
    seen: list[str] = []
    proxy.watch = lambda target, *_: seen.append(target)
    transport = SQSTransport.reopen(info, endpoint_url=proxy.url)
    assert transport.lean is not None and transport.lean.ready and seen == []
    assert transport.receive(10, 0, 30) == []
    assert seen == ["AmazonSQS.ReceiveMessage"]
    assert transport.lean.wire is not None and transport.lean.wire.opened == 1
    transport.close()
    # without credentials to sign with, nothing is learnt: the first call says so
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    unsigned = SQSTransport.reopen(info, endpoint_url=proxy.url)
    assert unsigned.lean is not None and not unsigned.lean.ready
    with pytest.raises(CredentialsError):
        unsigned.receive(10, 0, 30)
    assert seen == ["AmazonSQS.ReceiveMessage"]
    unsigned.close()


# Found by review: the calls around the batches, answered with nothing.


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
