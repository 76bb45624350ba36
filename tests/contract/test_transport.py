"""One contract, two transports: the in-memory model and moto's HTTP SQS server.

Every test here runs against both, so the in-memory transport cannot drift from
what a real endpoint does. Where moto and real SQS differ (docs/testing.md), the
real behaviour is tested on the in-memory transport in tests/unit.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from sqsworker import Worker, WorkerConfig
from sqsworker.clock import FakeClock
from sqsworker.errors import QueueNotFound, TransportError
from sqsworker.events import Tally
from sqsworker.local import LocalSQS
from sqsworker.receiving import LOOP_RECEIVE_MOST
from sqsworker.transports import BatchResult, Envelope, OutgoingMessage, Transport, send_all
from sqsworker.transports import sqs as sqs_module
from sqsworker.transports.memory import MemorySQS
from sqsworker.transports.sqs import SQSTransport

from ..conftest import unique, wait_until

T = TypeVar("T")


@dataclass
class Env:
    kind: str
    memory: MemorySQS | None = None
    clock: FakeClock | None = None
    server: LocalSQS | None = None
    sqs_client: str | None = None  # at moto's server: the client of the hot calls
    loop: asyncio.AbstractEventLoop | None = None  # the hot calls awaited on this loop
    on_loop: list[OnLoop] = field(default_factory=list)

    def queue(
        self, name: str, *, max_receive_count: int | None = None, **attributes: str
    ) -> Transport:
        name = unique(name.removesuffix(".fifo")) + (".fifo" if name.endswith(".fifo") else "")
        if self.memory is not None:
            if name.endswith(".fifo"):
                attributes["FifoQueue"] = "true"
            if max_receive_count is None:
                self.memory.create_queue(name, attributes)
            else:
                self.memory.create_queue_with_dlq(name, max_receive_count, **attributes)
            return self.memory.transport(name)
        assert self.server is not None
        self.server.create_queue(name, max_receive_count=max_receive_count, **attributes)
        transport = SQSTransport.connect(
            name, endpoint_url=self.server.endpoint_url, region="us-east-1", **self.client
        )
        # the lean client took the hot calls over, or botocore's has them all
        assert (transport.lean is not None and transport.lean.ready) == (self.sqs_client != "boto3")
        if self.loop is None:
            return transport
        self.on_loop.append(OnLoop(transport, self.loop))
        return self.on_loop[-1]

    @property
    def client(self) -> dict[str, str]:
        return {"sqs_client": self.sqs_client} if self.sqs_client else {}

    def receive_after(
        self, transport: Transport, seconds: float, n: int = 10, vis: int = 30
    ) -> list[Envelope]:
        """Receive once ``seconds`` have passed: the fake clock moves; moto's long poll waits."""
        if self.clock is not None:
            self.clock.advance(seconds)
            return transport.receive(n, 0, vis)
        return transport.receive(n, min(20, int(seconds) + 3), vis)

    def long_poll(self, transport: Transport, wait: int) -> tuple[list[Envelope], float]:
        """One receive of up to ``wait`` s while time passes: what it got, and when.

        moto's server waits in real time; on the fake clock the poll runs on a thread
        while the test moves time in steps of 0.25 s.
        """
        if self.clock is None:
            began = time.monotonic()
            got = transport.receive(1, wait, 30)
            return got, time.monotonic() - began
        memory, clock = self.memory, self.clock
        assert memory is not None
        polls = memory.requests["ReceiveMessage"]
        result: list[Envelope] = []
        took: list[float] = []
        finished = threading.Event()
        began = clock.monotonic()

        def poll() -> None:
            try:
                result.extend(transport.receive(1, wait, 30))
                took.append(clock.monotonic() - began)
            finally:
                finished.set()

        threading.Thread(target=poll, daemon=True).start()
        wait_until(lambda: memory.requests["ReceiveMessage"] > polls, what="the poll to start")
        while not finished.wait(0.01):
            clock.advance(0.25)
        assert took, "the poll failed"
        return result, took[0]


@pytest.fixture(scope="module")
def plain_moto() -> Iterator[LocalSQS]:
    """moto's own server (``python -m moto.server``) in a process of its own, without the
    changes ``sqsworker local`` makes to it; reached through a LocalSQS's helpers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _listening(port), 30, "moto's server to listen")
        server = LocalSQS()  # not started: its helpers, pointed at the other server
        server.endpoint_url = f"http://127.0.0.1:{port}"
        yield server
    finally:
        process.terminate()
        process.wait(10)


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


class OnLoop:
    """A transport whose hot calls are its ``*_async`` ones, awaited on ``loop`` (running
    on a thread of its own): what a coroutine worker's event loop calls."""

    def __init__(self, inner: SQSTransport, loop: asyncio.AbstractEventLoop) -> None:
        self.inner, self.loop = inner, loop
        self.info = inner.info

    def _await(self, call: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(call, self.loop).result(60)

    def receive(
        self, max_messages: int, wait: int, vis: int, attempt_id: str | None = None
    ) -> list[Envelope]:
        return self._await(self.inner.receive_async(max_messages, wait, vis, attempt_id))

    def delete_batch(self, entries: Sequence[tuple[str, str]]) -> BatchResult:
        return self._await(self.inner.delete_batch_async(entries))

    def change_visibility_batch(self, entries: Sequence[tuple[str, str, int]]) -> BatchResult:
        return self._await(self.inner.change_visibility_batch_async(entries))

    def __getattr__(self, name: str) -> Any:  # the calls a worker makes on its threads
        return getattr(self.inner, name)


@pytest.fixture(params=["memory", "moto", "moto-boto3", "moto-server", "moto-loop"])
def env(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """The in-memory SQS; the embedded SQS of ``sqsworker local`` (moto's server) through
    the default client (the lean one for the hot calls), through botocore's client alone,
    and through the lean client's calls awaited on an event loop; and moto's own server
    in a process of its own, through the default client."""
    if request.param == "memory":
        clock = FakeClock()
        yield Env("memory", memory=MemorySQS(clock), clock=clock)
        return
    fixture = "plain_moto" if request.param == "moto-server" else "local_sqs"
    server: LocalSQS = request.getfixturevalue(fixture)
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    client = "boto3" if request.param == "moto-boto3" else None
    if request.param != "moto-loop":
        yield Env("moto", server=server, sqs_client=client)
        return
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    env = Env("moto", server=server, loop=loop)
    try:
        yield env
    finally:
        for transport in env.on_loop:  # its connections, closed on their loop
            transport._await(_closed_on_loop(transport.inner))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


async def _closed_on_loop(transport: SQSTransport) -> None:
    transport.close_on_loop(asyncio.get_running_loop())


def test_receive_returns_body_and_attributes_and_hides_the_message(env: Env) -> None:
    q = env.queue("basic")
    attrs: dict[str, Any] = {"tenant": {"DataType": "String", "StringValue": "acme"}}
    send_all(q, [OutgoingMessage("hello", message_attributes=attrs)])
    [m] = q.receive(10, 1, 30)
    assert m.body == "hello"
    assert m.message_attributes["tenant"]["StringValue"] == "acme"
    assert m.receive_count == 1
    assert int(m.attributes["SentTimestamp"]) > 0
    assert q.receive(10, 0, 30) == []
    assert q.counts().in_flight == 1


def test_receive_returns_at_most_ten(env: Env) -> None:
    q = env.queue("many")
    send_all(q, [f"m{i}" for i in range(15)])
    first = q.receive(10, 1, 30)
    assert 1 <= len(first) <= 10
    got = {m.body for m in first}
    while len(got) < 15:
        got |= {m.body for m in q.receive(10, 1, 30)}
    assert got == {f"m{i}" for i in range(15)}


def test_expired_visibility_redelivers_with_new_handle_and_count(env: Env) -> None:
    q = env.queue("expire")
    send_all(q, ["x"])
    [first] = q.receive(1, 1, 1)
    [second] = env.receive_after(q, 1.1, 1, 30)
    assert second.message_id == first.message_id
    assert second.receive_count == 2
    assert second.receipt_handle != first.receipt_handle


def test_visibility_zero_hands_the_message_back_at_once(env: Env) -> None:
    q = env.queue("handback")
    send_all(q, ["x"])
    [m] = q.receive(1, 1, 30)
    result = q.change_visibility_batch([("a", m.receipt_handle, 0)])
    assert result.succeeded == ["a"] and not result.failed
    [again] = q.receive(1, 0, 30)
    assert again.message_id == m.message_id


def test_extension_restarts_the_countdown_from_now(env: Env) -> None:
    q = env.queue("extend")
    send_all(q, ["x"])
    [m] = q.receive(1, 1, 1)
    assert q.change_visibility_batch([("a", m.receipt_handle, 30)]).succeeded == ["a"]
    assert env.receive_after(q, 1.5, 1, 30) == []


def _delayed(q: Transport) -> None:
    send_all(q, [OutgoingMessage("x", delay_seconds=1)])


def _expiring(q: Transport) -> None:
    send_all(q, ["x"])
    assert len(q.receive(1, 1, 1)) == 1


def _returned(q: Transport) -> None:
    send_all(q, ["x"])
    [m] = q.receive(1, 1, 30)
    assert q.change_visibility_batch([("a", m.receipt_handle, 1)]).succeeded == ["a"]


@pytest.mark.parametrize("hide", [_delayed, _expiring, _returned], ids=lambda f: f.__name__[1:])
def test_a_long_poll_returns_when_a_hidden_message_comes_back(
    env: Env, hide: Callable[[Transport], None]
) -> None:
    q = env.queue("comeback")
    hide(q)  # visible again in 1 s
    got, took = env.long_poll(q, 20)
    assert [m.body for m in got] == ["x"]
    assert 0.5 <= took < 10, took  # when the message came back, long before the poll's end


def test_delete_with_the_current_handle_removes_the_message(env: Env) -> None:
    q = env.queue("delete")
    send_all(q, ["x", "y"])
    got = q.receive(10, 1, 30)
    while len(got) < 2:
        got += q.receive(10, 1, 30)
    result = q.delete_batch([(str(i), m.receipt_handle) for i, m in enumerate(got)])
    assert sorted(result.succeeded) == ["0", "1"]
    assert q.counts().total == 0


def test_a_deleted_message_answers_deletes_but_not_visibility_changes(env: Env) -> None:
    q = env.queue("deleted")
    send_all(q, ["x"])
    [m] = q.receive(1, 1, 30)
    assert q.delete_batch([("d", m.receipt_handle)]).succeeded == ["d"]
    assert q.delete_batch([("d", m.receipt_handle)]).succeeded == ["d"]  # again: no error
    [failure] = q.change_visibility_batch([("a", m.receipt_handle, 30)]).failed
    # SQS: InvalidParameterValue, "Message does not exist or is not available for
    # visibility timeout change"; moto: ReceiptHandleIsInvalid. Both: the lease is lost.
    assert failure.id == "a" and failure.lease_lost and not failure.past_cap
    [failure] = q.delete_batch([("g", "garbage")]).failed
    assert (failure.id, failure.code) == ("g", "ReceiptHandleIsInvalid")


def test_invalid_handle_fails_its_entry_not_the_batch(env: Env) -> None:
    q = env.queue("entries")
    send_all(q, ["x"])
    [m] = q.receive(1, 1, 30)
    result = q.change_visibility_batch([("good", m.receipt_handle, 60), ("bad", "garbage", 60)])
    assert result.succeeded == ["good"]
    [failure] = result.failed
    assert failure.id == "bad" and failure.lease_lost


@pytest.mark.parametrize(
    ("entries", "code"),
    [
        ([], "EmptyBatchRequest"),
        ([(str(i), f"h{i}") for i in range(11)], "TooManyEntriesInBatchRequest"),
        ([("a", "h1"), ("a", "h2")], "BatchEntryIdsNotDistinct"),
        ([("a\n", "h1")], "InvalidBatchEntryId"),  # a pattern's $ let a final newline by
        ([("a" * 81, "h1")], "InvalidBatchEntryId"),
    ],
)
def test_malformed_batches_are_refused_whole(
    env: Env, entries: list[tuple[str, str]], code: str
) -> None:
    q = env.queue("batchrules")
    with pytest.raises(TransportError) as raised:
        q.delete_batch(entries)
    assert raised.value.code == code


def test_visibility_beyond_twelve_hours_is_refused_not_clamped(env: Env) -> None:
    q = env.queue("cap")
    send_all(q, ["x"])
    [m] = q.receive(1, 1, 60)
    if env.clock is not None:
        env.clock.advance(10)
    else:  # let a second pass since the receive
        received = time.monotonic()
        wait_until(lambda: time.monotonic() - received >= 1.0, what="a second to pass")
    result = q.change_visibility_batch([("a", m.receipt_handle, 43200)])
    [failure] = result.failed
    assert failure.code == "InvalidParameterValue"


def test_redrive_moves_the_message_after_max_receives(env: Env) -> None:
    q = env.queue("redrive", max_receive_count=2)
    assert q.info.max_receive_count == 2 and q.info.dead_letter_arn
    send_all(q, ["poison"])
    for _ in range(2):
        [m] = env.receive_after(q, 0, 1, 30)
        q.change_visibility_batch([("a", m.receipt_handle, 0)])
    assert q.receive(1, 0, 30) == []
    dlq = q.open(q.info.dead_letter_arn or "")
    [dead] = env.receive_after(dlq, 0)
    assert dead.body == "poison"


def test_counts_tell_visible_in_flight_and_delayed(env: Env) -> None:
    q = env.queue("counts")
    send_all(q, ["a", "b", OutgoingMessage("later", delay_seconds=60)])
    [m] = q.receive(1, 1, 30)
    counts = q.counts()
    assert (counts.visible, counts.in_flight, counts.delayed) == (1, 1, 1)
    assert m.body in {"a", "b"}


def test_fifo_delivers_no_later_message_of_a_group_in_flight(env: Env) -> None:
    q = env.queue("order.fifo")
    assert q.info.fifo
    send_all(
        q,
        [
            OutgoingMessage("a1", group_id="a", deduplication_id="a1"),
            OutgoingMessage("a2", group_id="a", deduplication_id="a2"),
            OutgoingMessage("b1", group_id="b", deduplication_id="b1"),
        ],
    )
    [first] = q.receive(1, 1, 30)
    assert first.body == "a1" and first.attributes["MessageGroupId"] == "a"
    [second] = q.receive(1, 1, 30)
    assert second.body == "b1"
    assert q.receive(10, 0, 30) == []
    q.delete_batch([("x", first.receipt_handle)])
    [third] = q.receive(10, 1, 30)
    assert third.body == "a2"


def test_a_fair_queue_keeps_the_group_and_delivers_a_group_side_by_side(env: Env) -> None:
    # A standard queue takes a MessageGroupId (fair queues): it names the tenant and
    # orders nothing, so one group's messages come out together.
    q = env.queue("tenants")
    assert not q.info.fifo
    send_all(q, [OutgoingMessage(f"t{i}", group_id="tenant-1") for i in range(3)])
    got = q.receive(10, 1, 30)
    assert sorted(m.body for m in got) == ["t0", "t1", "t2"]
    assert {m.attributes["MessageGroupId"] for m in got} == {"tenant-1"}


def test_fifo_drops_a_repeated_deduplication_id(env: Env) -> None:
    q = env.queue("dedup.fifo")
    send_all(q, [OutgoingMessage("same", group_id="g", deduplication_id="d1")] * 2)
    assert len(q.receive(10, 1, 30)) == 1
    assert q.counts().total == 1


def test_queue_info_reads_the_redrive_policy(env: Env) -> None:
    q = env.queue("info", max_receive_count=5, VisibilityTimeout="45")
    assert q.info.visibility_timeout == 45
    assert q.info.max_receive_count == 5
    assert q.info.dead_letter_arn and q.info.dead_letter_arn.endswith("-dlq")
    assert q.info.url.rstrip("/").endswith("/" + q.info.name)


def test_unknown_queue_is_refused_clearly(env: Env) -> None:
    with pytest.raises(QueueNotFound) as raised:
        if env.memory is not None:
            env.memory.transport("no-such-queue")
        else:
            assert env.server is not None
            SQSTransport.connect("no-such-queue", endpoint_url=env.server.endpoint_url)
    assert "no-such-queue" in str(raised.value)


def test_binary_attributes_arrive_as_the_bytes_sent(env: Env) -> None:
    q = env.queue("binary")
    raw = bytes(range(256))
    attributes = {
        "blob": {"DataType": "Binary", "BinaryValue": raw},
        "text": {"DataType": "String", "StringValue": "ü ✓"},
        "count": {"DataType": "Number", "StringValue": "42"},
    }
    send_all(q, [OutgoingMessage("x", message_attributes=attributes)])
    [m] = q.receive(10, 1, 30)
    assert m.message_attributes["blob"]["BinaryValue"] == raw
    assert m.message_attributes["text"]["StringValue"] == "ü ✓"
    assert m.message_attributes["count"]["StringValue"] == "42"


@pytest.mark.parametrize("sqs_client", ["lean", "boto3"])
def test_only_the_lean_client_receives_and_deletes_on_a_coroutine_worker_s_loop(
    local_sqs: LocalSQS, monkeypatch: pytest.MonkeyPatch, sqs_client: str
) -> None:
    # botocore's client (or a proxy) would make its calls on asyncio's default threads,
    # the ones a handler's asyncio.to_thread waits for: its calls stay on threads
    for key, value in local_sqs.env().items():
        monkeypatch.setenv(key, value)
    name = unique("onloop")
    local_sqs.create_queue(name)
    transport = SQSTransport.connect(
        name, endpoint_url=local_sqs.endpoint_url, sqs_client=sqs_client
    )
    send_all(transport, ["a", "b", "c"])
    ran: list[str] = []
    deleted_on: list[str] = []
    for name_of_call in ("delete_batch", "delete_batch_async"):
        call = getattr(transport, name_of_call)

        def recorded(*args: Any, _call: Any = call) -> Any:
            deleted_on.append(threading.current_thread().name.rsplit("-", 1)[0])
            return _call(*args)

        monkeypatch.setattr(transport, name_of_call, recorded)

    async def handler(message: Any) -> None:
        ran.append(message.body)

    config = WorkerConfig(queue=name, concurrency=4, wait_time=1, metrics_port=None)
    worker = Worker(handler, config, transport=transport)
    before = set(threading.enumerate())
    worker.start()
    try:
        wait_until(lambda: len(ran) == 3, what="the three messages to run")
        wait_until(lambda: worker.keeper.held_count() == 0, what="their deletes")  # type: ignore[union-attr]
        threads = {t.name.rsplit("-", 1)[0] for t in set(threading.enumerate()) - before}
        assert ("sqsworker-receiver" in threads) == (sqs_client == "boto3")
        assert (worker.receiver._loop is not None) == (sqs_client == "lean")
        on_loop = {"sqsworker-event"} if sqs_client == "lean" else {"sqsworker-lease-sender"}
        assert set(deleted_on) == on_loop
    finally:
        worker.request_stop()
        assert worker.shutdown() == 0
    assert sorted(ran) == ["a", "b", "c"]
    assert transport.counts().visible + transport.counts().in_flight == 0


def test_a_coroutine_worker_runs_on_the_event_loop_its_policy_makes(
    local_sqs: LocalSQS, monkeypatch: pytest.MonkeyPatch
) -> None:
    # uvloop.install() in a handler's module, as users of it do: the worker's loop is
    # uvloop's, whose transports are not asyncio.Transport's subclasses (each receive on
    # the loop failed on an assertion there, and the worker received nothing)
    uvloop = pytest.importorskip("uvloop")
    for key, value in local_sqs.env().items():
        monkeypatch.setenv(key, value)
    name = unique("uvloop")
    local_sqs.create_queue(name)
    transport = SQSTransport.connect(name, endpoint_url=local_sqs.endpoint_url, sqs_client="lean")
    send_all(transport, [str(i) for i in range(25)])
    ran: list[str] = []
    loops: set[str] = set()

    async def handler(message: Any) -> None:
        loops.add(type(asyncio.get_running_loop()).__module__)
        await asyncio.sleep(0.01)
        ran.append(message.body)

    config = WorkerConfig(queue=name, concurrency=8, wait_time=1, metrics_port=None)
    tally = Tally()
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    try:
        worker = Worker(handler, config, transport=transport, observer=tally)
        worker.start()
        try:
            wait_until(lambda: len(ran) == 25, what="the messages to run")
            wait_until(lambda: worker.keeper.held_count() == 0, what="their deletes")  # type: ignore[union-attr]
            assert worker.receiver._loop is not None  # received on the loop, not on threads
        finally:
            worker.request_stop()
            assert worker.shutdown() == 0
    finally:
        asyncio.set_event_loop_policy(None)
    assert loops == {"uvloop"}
    assert sorted(ran, key=int) == [str(i) for i in range(25)]
    assert tally.counts["receive_failures"] == 0
    assert transport.counts().visible + transport.counts().in_flight == 0


def test_a_receive_on_the_loop_is_waited_out_as_long_as_the_client_allows_it() -> None:
    # at the shutdown a receive on the event loop is given up only once the SQS client's
    # own timeouts are past (a loop that runs has ended it by then)
    client, _ = sqs_module._client("http://127.0.0.1:1", "us-east-1", 1, "boto3")
    config = client.meta.config
    assert config.connect_timeout + config.read_timeout < LOOP_RECEIVE_MOST
