"""``python -m bench.peers``: sqsworker against the consumers users would pick instead.

Celery on SQS (kombu's SQS transport), dramatiq with dramatiq_sqs, Doist's sqs-workers,
the naive loop (``bench/naive.py``: receive 10, run each, delete each) and a bare boto3
loop (receive 10, delete the 10 in one batch: the floor of any boto3 consumer). Each runs
as its docs show, in a process of its own; the frameworks from ``bench/.venv-peers``
(built here from ``bench/peers-requirements.txt`` when missing: ``make bench-peers``),
never from sqsworker's environment. Three measurements:

- **Throughput** against ``bench.endpoint``, an endless SQS endpoint in another process
  that answers at once, so all the CPU a consumer spends is its own: msg/s, the CPU of the
  consumer's processes (utime + stime from /proc, every process of its tree: Celery and
  dramatiq fork workers) per message deleted, and the requests per message counted at the
  endpoint. Each framework's producer sends one message in its own envelope, and the
  endpoint serves endless copies of it. Each consumer runs with its defaults.
- **A slow handler**: 4 messages whose handler takes 3 s, on a 2 s visibility timeout,
  two consumer processes (replicas), each running 4 at once where the consumer runs
  handlers side by side; on moto's server (a real queue: visibility, redelivery; it also
  deletes with a stale receipt handle, which SQS need not do). Handler runs beyond the 4,
  runs of one message at the same time, and whether the queue was done in time.
- **SIGTERM**: 10 messages, 2 s handlers, 2 at once, a 30 s visibility timeout; SIGTERM
  half a second after the first handler starts. Of the running handlers, how many finished;
  how long the process took to exit; how long until every message not done was visible
  again (about 30 s: stranded until its visibility timeout ran out); messages lost
  (deleted, never done). The same with SIGKILL.

Prints the tables (Markdown) and draws ``--chart`` (docs/comparison.png).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import venv
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqsworker.local import CREDENTIALS, REGION, LocalSQS

from .endpoint import Endpoint

ROOT = Path(__file__).resolve().parents[1]
PEERS = ROOT / "bench" / ".venv-peers"
REQUIREMENTS = ROOT / "bench" / "peers-requirements.txt"
STAMP = PEERS / ".installed"
TICK = os.sysconf("SC_CLK_TCK")
RESULTS = ROOT / "bench" / "results" / "peers.json"
START_LIMIT = 60.0  # seconds a consumer gets to delete its first message
EXIT_LIMIT = 40.0  # seconds a consumer gets to exit after SIGTERM before SIGKILL


def ensure_peers() -> Path:
    """bench/.venv-peers with the pinned frameworks; built when missing or out of date."""
    python = PEERS / "bin" / "python"
    if not STAMP.exists() or STAMP.stat().st_mtime < REQUIREMENTS.stat().st_mtime:
        print(f"installing {REQUIREMENTS.name} into {PEERS} ...", flush=True)
        venv.create(PEERS, with_pip=True, clear=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "-r", str(REQUIREMENTS)], check=True
        )
        STAMP.touch()
    return python


@dataclass(frozen=True)
class Consumer:
    """One consumer: how to start it, in which envelope its messages come, and how."""

    name: str
    envelope: str  # "plain", or the framework whose producer makes its messages
    command: Callable[[str, int | None, int], list[str]]  # (queue, concurrency, visibility)
    how: str  # how it runs by default, for the table
    env: tuple[tuple[str, str], ...] = ()  # more environment for it
    measures: tuple[str, ...] = ("throughput", "slow", "SIGTERM", "SIGKILL")
    lease: int | None = None  # its visibility timeout when stopped, if not 30 s


def consumers(peers: Path) -> list[Consumer]:
    main = sys.executable
    peer = str(peers)

    def sqsworker(queue: str, concurrency: int | None, visibility: int) -> list[str]:
        wait = ["--wait-time", "0"] if visibility < 22 else []
        return [
            main, "-m", "sqsworker.cli", "run", "bench.handlers:peer", "--queue", queue,
            "--visibility-timeout", str(visibility), "--metrics-port", "0", *wait,
            *(["--concurrency", str(concurrency)] if concurrency else []),
        ]  # fmt: skip

    def naive(queue: str, concurrency: int | None, visibility: int) -> list[str]:
        return [main, "-m", "bench.naive", queue, str(visibility), "bench.handlers:peer"]

    def boto3_loop(queue: str, concurrency: int | None, visibility: int) -> list[str]:
        return [peer, "-m", "bench.peer_apps.boto3_loop"]

    def celery(queue: str, concurrency: int | None, visibility: int) -> list[str]:
        command = [peer, "-m", "celery", "-A", "bench.peer_apps.celery_app", "worker"]
        command += [
            "--loglevel",
            os.environ.get("PEER_CELERY_LOGLEVEL", "WARNING"),
            "--without-mingle",
            "--without-gossip",
        ]
        return command + (["--concurrency", str(concurrency)] if concurrency else [])

    def dramatiq(queue: str, concurrency: int | None, visibility: int) -> list[str]:
        command = [peer, "-m", "dramatiq", "bench.peer_apps.dramatiq_app"]
        return command + (
            ["--processes", "1", "--threads", str(concurrency)] if concurrency else []
        )

    def sqs_workers(queue: str, concurrency: int | None, visibility: int) -> list[str]:
        return [peer, "-m", "bench.peer_apps.sqs_workers_app"]

    return [
        Consumer("sqsworker", "plain", sqsworker, "`sqsworker run`: 10 handler threads"),
        Consumer(
            "sqsworker, 5 s lease", "plain", sqsworker, "the same, `--visibility-timeout 5`",
            measures=("SIGTERM", "SIGKILL"), lease=5,
        ),
        Consumer("Celery", "celery", celery, "`celery worker`: prefork, a process per core"),
        Consumer(
            "Celery, polling 0", "celery", celery, "the same, `polling_interval` 0",
            (("PEER_CELERY_POLLING_INTERVAL", "0"),), ("throughput",),
        ),
        Consumer(
            "Celery, acks_late", "celery", celery, "the same, `task_acks_late`",
            (("PEER_CELERY_ACKS_LATE", "1"),), ("slow", "SIGTERM", "SIGKILL"),
        ),
        Consumer("dramatiq", "dramatiq", dramatiq, "`dramatiq`: a process per core, 8 threads"),
        Consumer("sqs-workers", "sqs_workers", sqs_workers, "`queue.process_queue()`: one thread"),
        Consumer("naive loop", "plain", naive, "receive 10, run and delete each; one thread"),
        Consumer(
            "boto3 loop", "plain", boto3_loop, "receive 10, delete batch of 10; one thread",
            measures=("throughput",),
        ),
    ]  # fmt: skip


# -- a consumer's processes ---------------------------------------------------------------


def tree_cpu(root: int) -> float:
    """utime + stime, in seconds, of ``root`` and every process descended from it (and of
    the children they have waited for)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(f) for f in fields[11:15]) / TICK
    total = 0.0
    for pid, seconds in times.items():
        ancestor = pid
        while ancestor not in (root, 0, 1) and ancestor in parents:
            ancestor = parents[ancestor]
        if ancestor == root:
            total += seconds
    return total


def environment(url: str, queue: str, queue_url: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        **CREDENTIALS,
        "PYTHONPATH": str(ROOT),
        "AWS_ENDPOINT_URL_SQS": url,
        "AWS_REGION": REGION,
        "AWS_DEFAULT_REGION": REGION,
        "PEER_QUEUE": queue,
        "PEER_QUEUE_URL": queue_url,
        **extra,
    }


def start(command: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            list(command), env=env, cwd=ROOT, stdout=out, stderr=out, start_new_session=True
        )


def stop(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> float | None:
    """Signal the consumer's main process; seconds until it exited, or None if it did not
    within EXIT_LIMIT (then its whole process group is killed)."""
    signalled = time.perf_counter()
    if process.poll() is None:
        process.send_signal(sig)
    try:
        process.wait(EXIT_LIMIT)
        exited: float | None = time.perf_counter() - signalled
    except subprocess.TimeoutExpired:
        exited = None
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)  # stray workers of a pool
    process.wait()
    return exited


def produce(
    peers: Path, consumer: Consumer, env: dict[str, str], ids: Sequence[str], sender: Any = None
) -> None:
    """``ids`` as messages in the consumer's own format (plain: the ID is the body)."""
    if consumer.envelope == "plain":
        for id_ in ids:
            sender(id_)
        return
    subprocess.run(
        [str(peers), "-m", "bench.peer_apps.produce", consumer.envelope, *ids],
        env=env,
        cwd=ROOT,
        check=True,
        capture_output=True,
    )


# -- throughput against the endless endpoint ---------------------------------------------


def throughput(
    peers: Path,
    consumer: Consumer,
    endpoint: Endpoint,
    scratch: Path,
    warmup: float,
    seconds: float,
) -> dict[str, float]:
    queue = "peers-" + consumer.envelope.replace("_", "-")
    queue_url = f"{endpoint.url}/000000000000/{queue}"
    env = environment(endpoint.url, queue, queue_url, **dict(consumer.env))
    if consumer.envelope != "plain":  # the endpoint serves copies of these from now on
        produce(peers, consumer, env, [f"x{i}" for i in range(200)])
    process = start(consumer.command(queue, None, 30), env, scratch / f"{consumer.name}.log")
    try:
        # The warm-up counts from its first delete: on a loaded machine a framework's start
        # alone can take many seconds.
        first = endpoint.stats().get("deleted", 0)
        limit = time.perf_counter() + START_LIMIT
        while endpoint.stats().get("deleted", 0) == first and time.perf_counter() < limit:
            if process.poll() is not None:
                break
            time.sleep(0.2)
        time.sleep(warmup)
        if process.poll() is not None:
            raise RuntimeError(f"{consumer.name} exited with {process.returncode}")
        before, cpu, began = endpoint.stats(), tree_cpu(process.pid), time.perf_counter()
        time.sleep(seconds)
        after, cpu = endpoint.stats(), tree_cpu(process.pid) - cpu
        elapsed = time.perf_counter() - began
    finally:
        stop(process)
    deleted = after.get("deleted", 0) - before.get("deleted", 0)
    requests = Counter(after["requests"])
    requests.subtract(before["requests"])
    if not deleted:
        raise RuntimeError(f"{consumer.name} deleted no message in {seconds} s")
    return {
        "rate": deleted / elapsed,
        "cores": cpu / elapsed,
        "cpu_us": cpu / deleted * 1e6,
        "requests": sum(requests.values()) / deleted,
        "receives": requests["ReceiveMessage"] / deleted,
    }


# -- behaviour on a real queue (moto's server) --------------------------------------------


class Ledger:
    """The "start ID PID" / "done ID PID" lines the handlers wrote."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.touch()

    def lines(self) -> list[tuple[str, str]]:
        return [
            (parts[0], parts[1])
            for parts in (line.split() for line in self.path.read_text().splitlines())
        ]

    def starts(self) -> Counter[str]:
        return Counter(id_ for what, id_ in self.lines() if what == "start")

    def done(self) -> set[str]:
        return {id_ for what, id_ in self.lines() if what == "done"}

    def running(self) -> set[str]:
        """IDs started more often than finished."""
        started, finished = Counter[str](), Counter[str]()
        for what, id_ in self.lines():
            (started if what == "start" else finished)[id_] += 1
        return {id_ for id_ in started if started[id_] > finished[id_]}

    def most_at_once(self) -> int:
        """The most runs of one message at the same time."""
        now: Counter[str] = Counter()
        most = 0
        for what, id_ in self.lines():
            now[id_] += 1 if what == "start" else -1
            most = max(most, now[id_])
        return most


class Queue:
    def __init__(self, sqs: LocalSQS, name: str, visibility: int) -> None:
        self.client = sqs.client()
        self.url = sqs.create_queue(name, max_receive_count=None, visibility_timeout=visibility)

    def counts(self) -> tuple[int, int]:
        """(visible, in flight)."""
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        got = self.client.get_queue_attributes(QueueUrl=self.url, AttributeNames=names)
        return int(got["Attributes"][names[0]]), int(got["Attributes"][names[1]])

    def send(self, body: str) -> None:
        self.client.send_message(QueueUrl=self.url, MessageBody=body)


def slow_handler(
    peers: Path, consumer: Consumer, sqs: LocalSQS, scratch: Path, limit: float
) -> dict[str, Any]:
    name = f"slow-{consumer.envelope}-{time.monotonic_ns()}"
    queue = Queue(sqs, name, visibility=2)
    ledger = Ledger(scratch / f"{name}.ledger")
    env = environment(
        sqs.endpoint_url, name, queue.url,
        PEER_HANDLER="sleep:3", PEER_VISIBILITY="2", LEDGER=str(ledger.path),
        **dict(consumer.env),
    )  # fmt: skip
    ids = [f"m{i}" for i in range(4)]
    produce(peers, consumer, env, ids, queue.send)
    processes = [
        start(consumer.command(name, 4, 2), env, scratch / f"{name}-{i}.log") for i in range(2)
    ]
    began = time.perf_counter()
    finished: float | None = None
    while time.perf_counter() - began < limit:
        time.sleep(0.2)
        if ledger.done() >= set(ids) and not ledger.running() and queue.counts() == (0, 0):
            finished = time.perf_counter() - began
            break
    for process in processes:
        stop(process)
    starts = ledger.starts()
    return {
        "extra": sum(starts.values()) - len(ids),
        "at_once": ledger.most_at_once(),
        "finished": finished,
        "left": sum(queue.counts()),
        "done": len(ledger.done()),
    }


def stopped(
    peers: Path, consumer: Consumer, sqs: LocalSQS, scratch: Path, sig: int
) -> dict[str, Any]:
    """10 messages, 2 s handlers, 2 at once, 30 s visibility (or the consumer's lease);
    ``sig`` soon after the first handler starts."""
    name = f"stop-{consumer.envelope}-{sig}-{time.monotonic_ns()}"
    lease = consumer.lease or 30
    queue = Queue(sqs, name, visibility=lease)
    ledger = Ledger(scratch / f"{name}.ledger")
    env = environment(
        sqs.endpoint_url, name, queue.url,
        PEER_HANDLER="sleep:2", PEER_VISIBILITY=str(lease), LEDGER=str(ledger.path),
        **dict(consumer.env),
    )  # fmt: skip
    ids = [f"m{i}" for i in range(10)]
    produce(peers, consumer, env, ids, queue.send)
    process = start(consumer.command(name, 2, lease), env, scratch / f"{name}.log")
    deadline = time.perf_counter() + 60
    while not ledger.starts() and time.perf_counter() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)
    held = queue.counts()[1]
    running = ledger.running()
    signalled = time.perf_counter()
    exited = stop(process, sig)
    # Every message not done is back once it is visible; wait past the 30 s visibility.
    back: float | None = None
    while time.perf_counter() - signalled < 36:
        visible, in_flight = queue.counts()
        if not in_flight:
            back = time.perf_counter() - signalled
            break
        time.sleep(0.05)
    visible, in_flight = queue.counts()
    done = ledger.done()
    return {
        "held": held,
        "running": len(running),
        "finished": len(running & done),
        "exited": exited,
        "back": back,
        "lost": len(ids) - len(done) - visible - in_flight,
    }


# -- the report -----------------------------------------------------------------------------


def seconds(value: float | None, limit: str) -> str:
    return f"{value:.1f} s" if value is not None else limit


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="throughput rounds (medians)")
    parser.add_argument("--seconds", type=float, default=5.0, help="measured, per consumer")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--only", nargs="*", help="consumers by name (default: all)")
    parser.add_argument("--skip", nargs="*", default=[], choices=["throughput", "behaviour"])
    parser.add_argument("--chart", type=Path, default=ROOT / "docs" / "comparison.png")
    args = parser.parse_args()
    peers = ensure_peers()
    chosen = [c for c in consumers(peers) if not args.only or c.name in args.only]
    rates: dict[str, list[dict[str, float]]] = {}
    slow: dict[str, dict[str, Any]] = {}
    terms: dict[str, dict[str, Any]] = {}
    kills: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as temporary:
        scratch = Path(temporary)
        if "throughput" not in args.skip:
            with Endpoint() as endpoint:
                for round_ in range(args.rounds):
                    order = chosen if round_ % 2 == 0 else chosen[::-1]
                    for consumer in order:
                        if "throughput" not in consumer.measures:
                            continue
                        result = throughput(
                            peers, consumer, endpoint, scratch, args.warmup, args.seconds
                        )
                        rates.setdefault(consumer.name, []).append(result)
                        print(
                            f"round {round_ + 1}, {consumer.name}: {result['rate']:.0f} msg/s, "
                            f"{result['cpu_us']:.0f} µs CPU a message, "
                            f"{result['requests']:.3f} requests a message",
                            flush=True,
                        )
        if "behaviour" not in args.skip:
            with LocalSQS() as sqs:
                for consumer in chosen:
                    if "slow" in consumer.measures:
                        slow[consumer.name] = slow_handler(peers, consumer, sqs, scratch, 40)
                        print(f"slow handler, {consumer.name}: {slow[consumer.name]}", flush=True)
                    for sig, results in ((signal.SIGTERM, terms), (signal.SIGKILL, kills)):
                        if sig.name in consumer.measures:
                            results[consumer.name] = stopped(peers, consumer, sqs, scratch, sig)
                            print(
                                f"{sig.name}, {consumer.name}: {results[consumer.name]}", flush=True
                            )
    report(chosen, rates, slow, terms, kills, args)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps({"throughput": rates, "slow": slow, "SIGTERM": terms, "SIGKILL": kills})
    )
    print(f"\nevery run: {RESULTS}")
    if rates and slow:
        chart(chosen, rates, slow, terms, kills, args.chart)
        print(f"\nchart: {args.chart}")


def medians(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: statistics.median(r[key] for r in runs) for key in runs[0]}


def report(
    chosen: list[Consumer],
    rates: dict[str, list[dict[str, float]]],
    slow: dict[str, dict[str, Any]],
    terms: dict[str, dict[str, Any]],
    kills: dict[str, dict[str, Any]],
    args: argparse.Namespace,
) -> None:
    if rates:
        print(
            f"\nThroughput, no-op handlers, endless endpoint (medians of {args.rounds} rounds "
            f"of {args.seconds:g} s):\n"
        )
        print("| consumer | as run | msg/s | cores busy | msg/s per core | CPU µs/msg "
              "| / boto3 loop | requests/msg |")  # fmt: skip
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        floor = rates.get("boto3 loop")
        for c in chosen:
            if c.name in rates:
                m = medians(rates[c.name])
                # Each round's CPU a message over the bare loop's of the same round.
                ratio = (
                    statistics.median(
                        run["cpu_us"] / base["cpu_us"]
                        for run, base in zip(rates[c.name], floor, strict=True)
                    )
                    if floor
                    else float("nan")
                )
                print(
                    f"| {c.name} | {c.how} | {m['rate']:,.0f} | {m['cores']:.2f} "
                    f"| {1e6 / m['cpu_us']:,.0f} | {m['cpu_us']:,.0f} | {ratio:.2f} "
                    f"| {m['requests']:.3f} |"
                )
    if slow:
        print(
            "\nA slow handler: 4 messages, 3 s handlers, 2 s visibility timeout, two consumer "
            "processes (moto):\n"
        )
        print("| consumer | extra runs | one message's runs at once | queue done |")
        print("|---|---:|---:|---|")
        for c in chosen:
            if c.name not in slow:
                continue
            s = slow[c.name]
            done = seconds(s["finished"], f"not in 40 s ({s['left']} left, {s['done']} done)")
            print(f"| {c.name} | {s['extra']} | {s['at_once']} | {done} |")
    for title, results in (("SIGTERM", terms), ("SIGKILL", kills)):
        if not results:
            continue
        print(
            f"\n{title} half a second after the first handler starts: 10 messages, 2 s "
            "handlers, 2 at once, 30 s visibility timeout (moto):\n"
        )
        print("| consumer | held | running | of them finished | exit | every message not "
              "done visible again | lost |")  # fmt: skip
        print("|---|---:|---:|---:|---:|---:|---:|")
        for c in chosen:
            if c.name not in results:
                continue
            r = results[c.name]
            print(
                f"| {c.name} | {r['held']} | {r['running']} | {r['finished']} "
                f"| {seconds(r['exited'], 'no (killed after 40 s)')} "
                f"| {seconds(r['back'], 'not within 36 s')} | {r['lost']} |"
            )


def chart(
    chosen: list[Consumer],
    rates: dict[str, list[dict[str, float]]],
    slow: dict[str, dict[str, Any]],
    terms: dict[str, dict[str, Any]],
    kills: dict[str, dict[str, Any]],
    path: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fast = [c.name for c in chosen if c.name in rates]
    m = {name: medians(rates[name]) for name in fast}
    tried = [c.name for c in chosen if c.name in slow]
    termed = [c.name for c in chosen if c.name in terms]
    killed = [c.name for c in chosen if c.name in kills]
    panels = [
        ("msg/s per core busy (higher is better)", fast, [1e6 / m[n]["cpu_us"] for n in fast]),
        ("CPU µs a message (lower is better)", fast, [m[n]["cpu_us"] for n in fast]),
        ("SQS requests a message (lower is better)", fast, [m[n]["requests"] for n in fast]),
        ("slow handler: extra runs of 4 messages (lower is better)", tried,
         [slow[n]["extra"] for n in tried]),
        ("SIGTERM: s until every message not done is visible\n(lower is better)", termed,
         [terms[n]["back"] if terms[n]["back"] is not None else 36 for n in termed]),
        ("SIGKILL: messages lost (lower is better)", killed, [kills[n]["lost"] for n in killed]),
    ]  # fmt: skip
    fig, axes = plt.subplots(2, 3, figsize=(15, 9))
    for ax, (title, names, values) in zip(axes.flat, panels, strict=True):
        colours = ["#2b8a3e" if n.startswith("sqsworker") else "#adb5bd" for n in names]
        bars = ax.bar(names, values, color=colours)
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v >= 100 else f"{v:.3g}" for v in values])
        ax.set_ylim(0, max([*values, 0.8]) * 1.15)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelrotation=35, labelsize=8)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
    fig.suptitle("sqsworker and the consumers users pick instead (python -m bench.peers)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
