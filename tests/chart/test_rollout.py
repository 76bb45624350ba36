"""What the chart renders, run as a kubelet would (tests/chart/kubelet.py): a rolling
update under load, the worst-case shutdown against the derived grace period, and a
liveness failure. The workers talk to moto's server through a proxy that records
every delivery, so a message left invisible by a pod that went away is seen."""

from __future__ import annotations

import itertools
import json
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from ..conftest import wait_until, written_lines
from ..faults.proxy import FaultProxy
from ..integration.conftest import fresh_sqs
from .kubelet import ROOT, Pod, PodSpec, image, pod_spec, rolling_update, scaled
from .test_chart import CHART, helm

pytestmark = pytest.mark.integration
IMAGE = image(ROOT / "Dockerfile", ROOT / "examples" / "Dockerfile")
HANDLER = "examples.orders:process"


# -- deliveries, as SQS saw them ----------------------------------------------------------


@dataclass
class Deliveries:
    """Every receive, delete and visibility change that went through the proxy.

    A message received again must have been let go first: deleted (then it is a
    duplicate delivery by SQS, which moto does not make) or made visible at once
    (handed back). A re-receive of a message whose last receipt was never let go
    came from a lease that ran out: a message stranded by a pod that went away.
    """

    lock: threading.Lock = field(default_factory=threading.Lock)
    receipts: dict[str, list[str]] = field(default_factory=dict)  # message id -> handles
    let_go: set[str] = field(default_factory=set)  # handles deleted or made visible
    receives: int = 0  # ReceiveMessage calls answered

    def __call__(self, target: str, request: bytes, status: int, answer: bytes) -> None:
        action = target.rsplit(".", 1)[-1]
        if status != 200:
            return
        sent, got = json.loads(request or b"{}"), json.loads(answer or b"{}")
        with self.lock:
            if action == "ReceiveMessage":
                self.receives += 1
                for message in got.get("Messages", []):
                    handles = self.receipts.setdefault(message["MessageId"], [])
                    handles.append(message["ReceiptHandle"])
            elif action in ("DeleteMessageBatch", "ChangeMessageVisibilityBatch"):
                done = {entry["Id"] for entry in got.get("Successful", [])}
                for entry in sent["Entries"]:
                    if entry["Id"] in done and entry.get("VisibilityTimeout", 0) == 0:
                        self.let_go.add(entry["ReceiptHandle"])
            elif action in ("DeleteMessage", "ChangeMessageVisibility") and (
                sent.get("VisibilityTimeout", 0) == 0
            ):
                self.let_go.add(sent["ReceiptHandle"])

    def stranded(self) -> list[str]:
        """Messages received again after a receipt that was never let go."""
        with self.lock:
            return [
                message
                for message, handles in self.receipts.items()
                if any(handle not in self.let_go for handle in handles[:-1])
            ]

    def received_again(self) -> int:
        """Receives of a message received before (hand-backs at shutdown, when none was
        stranded)."""
        with self.lock:
            return sum(len(handles) - 1 for handles in self.receipts.values())


# -- the cluster's parts ------------------------------------------------------------------


@dataclass
class Cluster:
    """moto's server in a process of its own (``fresh_sqs``: holding only this test's
    queues), the recording proxy before it, and a folder."""

    endpoint: str
    exports: dict[str, str]
    proxy: FaultProxy
    deliveries: Deliveries
    folder: Path

    def sqs(self) -> Any:
        return boto3.client(
            "sqs",
            endpoint_url=self.endpoint,
            region_name=self.exports["AWS_REGION"],
            aws_access_key_id=self.exports["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.exports["AWS_SECRET_ACCESS_KEY"],
        )

    def queue_url(self, name: str = "orders") -> str:
        return str(self.sqs().get_queue_url(QueueName=name)["QueueUrl"])

    def held(self, name: str = "orders") -> tuple[int, int]:
        """(visible, in flight) in the queue ``name``."""
        attributes = self.sqs().get_queue_attributes(
            QueueUrl=self.queue_url(name),
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        return (
            int(attributes["ApproximateNumberOfMessages"]),
            int(attributes["ApproximateNumberOfMessagesNotVisible"]),
        )

    def send(self, orders: list[dict[str, Any]], per_second: float) -> threading.Thread:
        """Send ``orders`` at a steady rate, 10 at a time, from a thread of its own (as
        producers do: a queue thousands deep would only measure moto's receive, which
        slows with the queue's length)."""
        sqs, url = self.sqs(), self.queue_url()

        def produce() -> None:
            began = time.monotonic()
            for start in range(0, len(orders), 10):
                entries = [
                    {"Id": str(i), "MessageBody": json.dumps(order)}
                    for i, order in enumerate(orders[start : start + 10])
                ]
                assert not sqs.send_message_batch(QueueUrl=url, Entries=entries).get("Failed")
                due = began + (start + 10) / per_second
                threading.Event().wait(max(0.0, due - time.monotonic()))

        producer = threading.Thread(target=produce)
        producer.start()
        return producer

    def values(self, **worker: Any) -> dict[str, Any]:
        """Chart values for the example handler on this cluster."""
        credentials = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
        return {
            "worker": {
                "handler": HANDLER,
                "queue": "orders",
                "endpointUrl": self.proxy.url,
                "region": self.exports["AWS_REGION"],
                "metricsPort": free_port(),
                **worker,
            },
            "extraEnv": [
                *({"name": name, "value": self.exports[name]} for name in credentials),
                {"name": "ORDERS_LEDGER", "value": str(self.folder / "ledger")},
            ],
        }

    def ledger(self) -> list[tuple[str, int, int]]:
        """(event, order id, receive count) for each line the handler wrote."""
        path = self.folder / "ledger"
        if not path.exists():
            return []
        lines = [line.split() for line in written_lines(path)]
        return [(event, int(order), int(count)) for event, _, order, count in lines]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    with fresh_sqs("orders") as exports:
        deliveries = Deliveries()
        proxy = FaultProxy(exports["AWS_ENDPOINT_URL_SQS"], watch=deliveries).start()
        try:
            yield Cluster(exports["AWS_ENDPOINT_URL_SQS"], exports, proxy, deliveries, tmp_path)
        finally:
            proxy.stop()


def rendered(cluster: Cluster, values: dict[str, Any], *extra: str) -> dict[str, Any]:
    """The chart's manifests for ``values``, by kind."""
    path = cluster.folder / f"values-{random.getrandbits(32):08x}.yaml"
    path.write_text(yaml.safe_dump(values))
    result = helm("template", "orders", str(CHART), "-f", str(path), *extra)
    assert result.returncode == 0, result.stderr
    return {doc["kind"]: doc for doc in yaml.safe_load_all(result.stdout) if doc}


class Node:
    """Where the pods run; what is left running at the end is killed."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.pods: list[Pod] = []

    def pod(self, prefix: str, spec: PodSpec) -> Pod:
        number = sum(p.name.startswith(prefix + "-") for p in self.pods)
        self.pods.append(Pod(f"{prefix}-{number}", spec, self.folder, "SQSWORKER_METRICS_HOST"))
        return self.pods[-1]

    def completions(self) -> list[float]:
        """When each "message processed" line was written, in order, across the pods."""
        return sorted(
            datetime.fromisoformat(line["timestamp"]).timestamp()
            for pod in self.pods
            for line in pod.log_lines()
            if line["event"] == "message processed"
        )


@pytest.fixture
def node(cluster: Cluster) -> Iterator[Node]:
    made = Node(cluster.folder)
    yield made
    for pod in made.pods:  # what the test measures is had: no need to wait out long polls
        if not pod.deleted:
            pod.kill()


# -- the rolling update -------------------------------------------------------------------


@pytest.mark.timeout(300)
def test_a_rolling_update_under_load_loses_strands_and_repeats_nothing(
    cluster: Cluster, node: Node, capsys: pytest.CaptureFixture[str]
) -> None:
    values = cluster.values(concurrency=40)
    manifests = rendered(cluster, values)
    deployment, budget = manifests["Deployment"], manifests["PodDisruptionBudget"]
    # The new version: a changed pod template, as a new image tag would make.
    upgrade = rendered(cluster, {**values, "podAnnotations": {"release": "2"}})["Deployment"]
    assert upgrade["spec"]["template"] != deployment["spec"]["template"]
    replicas = deployment["spec"]["replicas"]
    strategy = deployment["spec"]["strategy"]["rollingUpdate"]
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    seconds = random.Random(18)
    orders = [
        {"id": i, "kind": "slow", "seconds": round(seconds.uniform(0.2, 3.0), 2)}
        for i in range(1000)
    ]
    old_spec, new_spec = pod_spec(deployment, IMAGE), pod_spec(upgrade, IMAGE)
    old = [node.pod("old", old_spec).start() for _ in range(replicas)]
    for pod in old:
        assert pod.wait_ready(60), f"{pod.name} never became ready"
    producer = cluster.send(orders, per_second=40)
    wait_until(lambda: done(cluster) >= 150, timeout=120, what="the load flowing")
    before = done(cluster)
    rollout = rolling_update(old, lambda: node.pod("new", new_spec), deployment, timeout=240)
    during = done(cluster) - before
    producer.join()
    wait_until(lambda: cluster.held() == (0, 0), timeout=120, what="the queue drained")

    runs = Counter(order for event, order, _ in cluster.ledger() if event == "done")
    lost = [order["id"] for order in orders if runs[order["id"]] == 0]
    twice = [order for order, n in runs.items() if n > 1]
    gap = max(b - a for a, b in itertools.pairwise(node.completions()))
    exits = [exit for _, exit in rollout.replaced]
    rows = {
        "rollout": f"{rollout.seconds:.1f} s, {during} messages done meanwhile",
        "old pods, SIGTERM to exit": ", ".join(
            f"{name} {exit.seconds:.1f} s (exit {exit.code})" for name, exit in rollout.replaced
        )
        + f"; grace {grace} s, SIGKILLed {sum(exit.killed for exit in exits)}",
        "sent / lost / run twice": f"{len(orders)} / {len(lost)} / {len(twice)}",
        "received again (handed back first)": str(cluster.deliveries.received_again()),
        "stranded (received again, never let go)": str(len(cluster.deliveries.stranded())),
        "longest gap between completions": f"{gap:.2f} s",
        "ready pods, fewest / pods, most": f"{rollout.least_ready} / {rollout.most_pods}",
    }
    with capsys.disabled():
        print("\n" + "\n".join(f"  {name:<42} {value}" for name, value in rows.items()))

    assert len(cluster.deliveries.receipts) == len(orders)  # the proxy saw every delivery
    assert not lost and not twice, (lost, twice)
    assert cluster.held("orders-dlq") == (0, 0)
    assert cluster.deliveries.stranded() == []
    assert all(not exit.killed and exit.code == 0 and exit.seconds < grace for exit in exits)
    floor = replicas - scaled(strategy["maxUnavailable"], replicas, round_up=False)
    assert rollout.least_ready >= floor
    assert rollout.least_ready >= replicas - int(budget["spec"]["maxUnavailable"])
    assert rollout.most_pods <= replicas + scaled(strategy["maxSurge"], replicas, round_up=True)
    assert all(pod.restarts == 0 for pod in node.pods)
    assert during > 0 and gap < 5.0, f"no message was done for {gap:.1f} s"


def done(cluster: Cluster) -> int:
    return len({order for event, order, _ in cluster.ledger() if event == "done"})


# -- several handlers in one pod --------------------------------------------------------


def test_one_deployment_runs_two_handlers_each_on_its_queue(cluster: Cluster, node: Node) -> None:
    """The chart's handlers list: one pod runs both handlers of examples.orders, each on its
    queue with its own options, serves one /healthz for both, and stops both on SIGTERM."""
    sqs = cluster.sqs()
    refunds = sqs.create_queue(QueueName="refunds")["QueueUrl"]
    values = cluster.values(waitTime=1)
    del values["worker"]["handler"], values["worker"]["queue"]
    values["handlers"] = [
        {"handler": HANDLER, "queue": "orders"},
        {"handler": "examples.orders:refund", "queue": "refunds", "concurrency": 2},
    ]
    deployment = rendered(cluster, values)["Deployment"]
    pod = node.pod("worker", pod_spec(deployment, IMAGE)).start()
    assert pod.wait_ready(60)
    cluster.send([{"id": i} for i in range(5)], per_second=50).join()
    sqs.send_message_batch(
        QueueUrl=refunds,
        Entries=[{"Id": str(i), "MessageBody": json.dumps({"id": 100 + i})} for i in range(5)],
    )
    wait_until(
        lambda: (
            Counter(e for e, _, _ in cluster.ledger()) == {"attempt": 5, "done": 5, "refunded": 5}
        ),
        what="five orders done and five refunds",
    )
    started = {
        (line["queue"], line["concurrency"])
        for line in pod.log_lines()
        if line["event"] == "worker started"
    }
    # The decorator's 8 for orders (the chart sets no concurrency), the entry's 2 for refunds.
    assert started == {("orders", 8), ("refunds", 2)}
    ended = pod.delete()
    assert not ended.killed and ended.code == 0, ended
    assert cluster.held("orders") == (0, 0) and cluster.held("refunds") == (0, 0)


# -- the grace period -------------------------------------------------------------------


def test_the_grace_period_outlasts_the_worst_shutdown(cluster: Cluster, node: Node) -> None:
    """The worst case: a handler running past shutdownTimeout, and a long poll that has
    just begun on an empty queue when SIGTERM comes. The pod must exit by itself, before
    the SIGKILL the grace period would send, with the message visible again. The values
    ask for a grace period of 1 s, too short: the chart must raise it to what is needed."""
    chart = {"terminationGraceMarginSeconds": 2, "terminationGracePeriodSeconds": 1}
    shutdown, wait = 2, 3
    values = {**cluster.values(shutdownTimeout=shutdown, waitTime=wait), **chart}
    deployment = rendered(cluster, values)["Deployment"]
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace >= shutdown + wait + values["terminationGraceMarginSeconds"]
    pod = node.pod("worker", pod_spec(deployment, IMAGE)).start()
    assert pod.wait_ready(60)
    cluster.send([{"id": 1, "kind": "slow", "seconds": 60}], per_second=10).join()
    wait_until(lambda: ("attempt", 1, 1) in cluster.ledger(), what="the handler started")
    polls = cluster.deliveries.receives
    wait_until(lambda: cluster.deliveries.receives > polls, what="an empty receive answered")
    ended = pod.delete()  # the next long poll has just begun: it runs its full wait
    assert not ended.killed and ended.seconds < grace, ended
    assert ended.seconds >= wait - 0.5  # it did wait out the poll: the worst case was met
    assert ended.code == 1  # a handler outlived --shutdown-timeout
    assert cluster.held() == (1, 0)  # handed back: visible at once, not stranded


# -- liveness ---------------------------------------------------------------------------


def test_a_failing_liveness_probe_restarts_the_container(cluster: Cluster, node: Node) -> None:
    values = cluster.values(waitTime=1, shutdownTimeout=1, stallTimeout=1)
    values["probes"] = {"liveness": {"periodSeconds": 1, "failureThreshold": 2}}
    values["terminationGraceMarginSeconds"] = 1
    deployment = rendered(cluster, values)["Deployment"]
    pod = node.pod("worker", pod_spec(deployment, IMAGE)).start()
    assert pod.wait_ready(60)
    cluster.send([{"id": i} for i in range(5)], per_second=50).join()
    wait_until(lambda: done(cluster) == 5, what="the first orders done")
    # SQS hangs: the receive thread stops making progress, and /healthz says so.
    cluster.proxy.set(stall=1.0, stall_seconds=60)
    liveness = pod.spec.liveness
    assert liveness is not None
    wait_until(lambda: not liveness.passes(pod.ip), what="/healthz failing")
    cluster.proxy.set()  # calls already stuck stay stuck; new ones go through
    wait_until(lambda: pod.restarts == 1 and pod.ready, timeout=60, what="restarted and ready")
    [stuck] = pod.exits
    assert stuck.killed  # it could not finish its stuck long poll within the grace period
    cluster.send([{"id": i} for i in range(5, 10)], per_second=50).join()
    wait_until(lambda: done(cluster) == 10, what="the restarted container working")
    assert pod.restarts == 1
