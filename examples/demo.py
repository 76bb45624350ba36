"""`make demo`: the example order worker on an embedded SQS, from start to summary.

No AWS account is needed: moto's SQS server runs in this process on localhost.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections import Counter
from pathlib import Path

from sqsworker.local import LocalSQS
from sqsworker.transports import OutgoingMessage, send_all
from sqsworker.transports.sqs import SQSTransport

ROOT = Path(__file__).resolve().parents[1]
VISIBILITY = 3
MAX_RECEIVES = 3
WORKLOAD = {"normal": 20, "slow": 3, "flaky": 3, "poison": 2, "duplicate": 3}
COPIES = 2  # each "duplicate" order is sent twice with one idempotency key, as a producer retry


def main() -> int:
    with LocalSQS() as sqs, tempfile.TemporaryDirectory() as scratch:
        os.environ.update(sqs.env())
        sqs.create_queue("orders", max_receive_count=MAX_RECEIVES, visibility_timeout=VISIBILITY)
        queue = SQSTransport.connect("orders")
        dlq = queue.open("orders-dlq")
        ledger = Path(scratch) / "ledger.txt"
        ledger.touch()

        bodies: list[OutgoingMessage | str] = [
            json.dumps({"id": n, "kind": kind, "seconds": 5})
            for kind, count in WORKLOAD.items()
            for n in range(count)
            if kind != "duplicate"
        ]
        bodies.append("<order id=99>not json</order>")
        for n in range(WORKLOAD["duplicate"]):
            key = {"DataType": "String", "StringValue": f"order-{n}-attempt-1"}
            body = json.dumps({"id": n, "kind": "duplicate"})
            bodies += [OutgoingMessage(body, {"idempotency-key": key})] * COPIES
        send_all(queue, bodies)
        print(
            f"== embedded SQS at {sqs.endpoint_url}: sent {len(bodies)} orders to 'orders' "
            f"(visibility timeout {VISIBILITY} s, dead-letter queue after {MAX_RECEIVES} receives)"
        )
        print("== slow orders take 5 s: longer than the visibility timeout, so leases are renewed")
        print("== duplicate orders are each sent twice under one idempotency key")

        metrics_port = _free_port()
        command = [
            sys.executable,
            "-m",
            "sqsworker.cli",
            "run",
            "examples.orders:process",
            "--visibility-timeout",
            str(VISIBILITY),
            "--wait-time",
            "1",
            "--burst",
            "--backoff-base",
            "0.5",
            "--backoff-max",
            "2",
            "--metrics-port",
            str(metrics_port),
            "--log-format",
            "console",
            "--idempotency-store",
            f"sqlite:///{scratch}/orders.db",
        ]
        metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        print("== running: sqsworker run examples.orders:process --burst ...")
        print(f"== while it runs: curl {metrics_url} (also /healthz and /readyz)\n", flush=True)
        env = {**os.environ, "ORDERS_LEDGER": str(ledger), "PYTHONPATH": str(ROOT)}
        worker = subprocess.Popen(command, env=env, cwd=ROOT)

        done = threading.Event()
        scrapes: list[tuple[bool, str]] = []
        watcher = threading.Thread(
            target=_progress, args=(queue, dlq, metrics_url, scrapes, done), daemon=True
        )
        watcher.start()
        code = worker.wait()
        done.set()
        watcher.join()
        _summary(ledger, dlq, len(bodies))
        settled = [text for all_settled, text in scrapes if all_settled]
        _metrics(metrics_url, settled[-1] if settled else "")
        _next_steps()
        queue.close()
        return code


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _progress(
    queue: SQSTransport,
    dlq: SQSTransport,
    metrics_url: str,
    scrapes: list[tuple[bool, str]],
    done: threading.Event,
) -> None:
    """Scrape the metrics twice a second, each after reading the queue's counts: a scrape
    taken after SQS showed nothing left holds every message settled (each is counted
    before its delete). Print the counts every 2 seconds."""
    ticks = 0
    while not done.wait(0.5):
        counts = queue.counts()
        try:
            with urllib.request.urlopen(metrics_url, timeout=2) as response:
                scrapes.append((counts.total == 0, response.read().decode()))
        except OSError:
            pass  # not serving yet, or already stopped
        ticks += 1
        if ticks % 4 == 0:
            print(
                f"   .. queue: {counts.visible} waiting, {counts.in_flight} in flight; "
                f"dead-letter queue: {dlq.counts().visible}",
                flush=True,
            )


def _summary(ledger: Path, dlq: SQSTransport, sent: int) -> None:
    attempts: Counter[str] = Counter()
    done: Counter[str] = Counter()
    for line in ledger.read_text().splitlines():
        event, kind, _, _ = line.split()
        (attempts if event == "attempt" else done)[kind] += 1
    dead: Counter[str] = Counter()
    while batch := dlq.receive(10, 0, 30):
        for message in batch:
            try:
                dead[json.loads(message.body)["kind"]] += 1
            except ValueError:
                dead["malformed"] += 1
    notes = {
        "normal": "processed once, deleted",
        "slow": f"ran 5 s on a {VISIBILITY} s lease: renewed, never redelivered",
        "flaky": "failed once, retried after backoff, then succeeded",
        "poison": f"failed {MAX_RECEIVES} times, then moved to the dead-letter queue",
        "malformed": "body is not JSON: rejected straight to the dead-letter queue",
        "duplicate": f"sent {COPIES} times under one key: run once, the copy deleted unrun",
    }
    print("\n== summary")
    print(f"   {'kind':<10}{'sent':>6}{'runs':>6}{'done':>6}{'in DLQ':>8}   what happened")
    for kind, note in notes.items():
        sent_n = WORKLOAD.get(kind, 1) * (COPIES if kind == "duplicate" else 1)
        runs = attempts[kind] if kind != "malformed" else 0
        print(f"   {kind:<10}{sent_n:>6}{runs:>6}{done[kind]:>6}{dead[kind]:>8}   {note}")
    copies = WORKLOAD["duplicate"] * (COPIES - 1)
    lost = sent - copies - sum(done.values()) - sum(dead.values())
    print(
        f"\n   {sent} sent ({copies} of them copies), {sum(done.values())} done, "
        f"{sum(dead.values())} in the dead-letter queue, {lost} lost."
    )


def _metrics(url: str, text: str) -> None:
    """A few series of the last scrape: what Prometheus would have seen."""
    shown = (
        "sqsworker_messages_succeeded_total",
        "sqsworker_messages_failed_total",
        "sqsworker_messages_rejected_total",
        "sqsworker_messages_dead_lettered_total",
        "sqsworker_visibility_extensions_total",
        "sqsworker_duplicates_suppressed_total",
        "sqsworker_sqs_requests_total",
    )
    lines = [line for line in text.splitlines() if line.startswith(shown)]
    if not lines:
        return
    print(
        f"\n== metrics, scraped from {url} after the last message settled "
        "(all of them: docs/observability.md)"
    )
    for line in lines:  # the queue and handler labels are the same on every line
        line = re.sub(r'(handler|queue)="[^"]*",?', "", line).replace(",}", "}")
        print("   " + line.replace("{}", ""))


def _next_steps() -> None:
    print(
        '\n== next: try it by hand (README.md, "Try it by hand")\n'
        "   .venv/bin/sqsworker local --queue orders    # in one shell; export what it prints\n"
        "   . .venv/bin/activate                        # then, in another:\n"
        "   sqsworker send orders '{\"id\": 1}'\n"
        "   sqsworker queues orders\n"
        "   sqsworker run examples.orders:process"
    )


if __name__ == "__main__":
    sys.exit(main())
