"""``python -m bench.http``: the worker process's own CPU per message at an HTTP endpoint.

Each consumer (``bench.consumer``) runs in a process of its own against ``bench.endpoint``,
an endless SQS endpoint in another process that answers at once (or ``--latency-ms``
later) with fresh messages, so all the CPU the consumer's process spends is its own. After
``--warmup`` seconds, the process's CPU time (utime + stime from /proc/PID/stat, every
thread) and the endpoint's counts are read, again ``--seconds`` later, and the consumer is
stopped. Per message deleted in that window: the consumer's CPU, requests (every action),
and msg/s. Two rows run ``sqsworker run`` as it is deployed (its default options, a JSON
log line a message to a pipe the bench reads, metrics served); the others run a
``Worker`` with no logs or metrics, to compare its clients. Rounds alternate the order
of the consumers; the table gives medians, and each row's CPU per message as a fraction
of the bare boto3 loop's (``floor``), measured in the same run: a receive of 10 and one
delete batch of 10, on one thread.

``measure(command, endpoint)`` does one such measurement of any command that consumes
queue "bench" at the URL it is given: other consumers (other frameworks) can be measured
the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .endpoint import Endpoint
from .versus import Runner, worktree

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), in seconds."""
    return sum(cpu_split(pid))


def cpu_split(pid: int) -> tuple[float, float]:
    """utime and stime of process ``pid`` (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK  # fields 14 and 15 of proc(5)


def switches(pid: int) -> int:
    """Context switches of every thread of process ``pid`` so far (voluntary: a thread
    waited, on a lock, a condition or a socket; involuntary: it was preempted)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "status").read_text()
        except FileNotFoundError:  # the thread ended
            continue
        for line in text.splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


def measure(
    command: Sequence[str],
    endpoint: Endpoint,
    *,
    warmup: float = 2.0,
    seconds: float = 5.0,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> dict[str, float]:
    """Start ``command``, let it run ``warmup`` seconds past its first delete, then
    measure it for ``seconds``:
    msg/s, its process's CPU µs per message, requests per message, and the endpoint's CPU
    µs per message (and the kernel's part of it), context switches per message; then
    SIGTERM it."""
    environment = {
        "PYTHONPATH": str(ROOT),
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        **os.environ,
        **(env or {}),
    }
    # Its log lines go to a pipe, as a container's do, read and dropped (the last 4 KiB
    # kept for an error's words).
    process = subprocess.Popen(list(command), env=environment, stderr=subprocess.PIPE, cwd=cwd)
    tail = _Tail(process)
    try:
        # the warm-up counts from the first delete: starting (imports, connecting) is
        # not the steady state, and takes seconds on a loaded machine
        deleted = endpoint.stats().get("deleted", 0)
        deadline = time.monotonic() + 120
        while endpoint.stats().get("deleted", 0) == deleted:
            if process.poll() is not None:
                raise RuntimeError(f"{command} exited with {process.returncode}: {tail}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{command} deleted no message in 120 s")
            time.sleep(0.05)
        time.sleep(warmup)
        before, (user, system), waits, service, started = (
            endpoint.stats(),
            cpu_split(process.pid),
            switches(process.pid),
            cpu_seconds(endpoint.pid),
            time.perf_counter(),
        )
        time.sleep(seconds)
        after, (user, system), waits, service, elapsed = (
            endpoint.stats(),
            (a - b for a, b in zip(cpu_split(process.pid), (user, system), strict=True)),
            switches(process.pid) - waits,
            cpu_seconds(endpoint.pid) - service,
            time.perf_counter() - started,
        )
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    messages = after.get("deleted", 0) - before.get("deleted", 0)
    requests = sum(after["requests"].values()) - sum(before["requests"].values())
    if not messages:
        raise RuntimeError(f"{command} deleted no message in {seconds} s")
    return {
        "rate": messages / elapsed,
        "cpu_us_per_message": (user + system) / messages * 1e6,
        "system_us_per_message": system / messages * 1e6,
        "switches_per_message": waits / messages,
        "requests_per_message": requests / messages,
        "endpoint_cpu_us_per_message": service / messages * 1e6,
        "messages": messages,
    }


class _Tail:
    """Reads a process's stderr to its end on a thread of its own; keeps the last 4 KiB."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.last = b""
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen[bytes]) -> None:
        assert process.stderr is not None
        while chunk := os.read(process.stderr.fileno(), 65536):
            self.last = (self.last + chunk)[-4096:]

    def __str__(self) -> str:
        self._thread.join(5)
        return self.last.decode(errors="replace")


def deployed(kind: str, url: str, *extra: str) -> list[str]:
    """``sqsworker run`` as deployed: its default options (10 threads for ``def``; 256
    coroutines for ``async def``), JSON log lines, metrics served; ``extra`` options."""
    handler = "bench.consumer:noop" if kind == "def" else "bench.consumer:anoop"
    command = [sys.executable, "-m", "sqsworker.cli", "run", handler, "--queue", "bench"]
    command += ["--endpoint-url", url, "--metrics-port", "0", "--log-format", "json", *extra]
    return command + ([] if kind == "def" else ["--concurrency", "256"])


def consumer(kind: str, url: str, concurrency: int = 16, client: str = "") -> list[str]:
    command = [sys.executable, "-m", "bench.consumer", kind, url, f"--concurrency={concurrency}"]
    return command + ([f"--client={client}"] if client else [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="measured, per consumer")
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--latency-ms", type=float, default=0, help="added to every answer")
    parser.add_argument(
        "--tls", action="store_true", help="HTTPS, as SQS speaks it (the consumers trust its CA)"
    )
    parser.add_argument(
        "--against",
        metavar="REF",
        help="also run the two `sqsworker run` rows on REF's sqsworker (a git ref), side by side",
    )
    parser.add_argument(
        "--no-pin-cpu",
        dest="pin_cpu",
        action="store_false",
        help="leave out the two `sqsworker run --pin-cpu` rows",
    )
    parser.add_argument(
        "--clients",
        nargs="+",
        default=["boto3", "lean"],
        help="--sqs-client values to run the worker with, side by side (default: both)",
    )
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        # REF's rows run with REF's sqsworker first on the path and this bench/ (what
        # versus.Runner sets up: a folder holding a link to it).
        against: tuple[Path, dict[str, str]] | None = None
        if args.against:
            tree = stack.enter_context(worktree(args.against))
            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            Runner(folder)
            against = folder, {"PYTHONPATH": str(tree)}
        _run(args, against)


def _run(args: argparse.Namespace, against: tuple[Path, dict[str, str]] | None) -> None:
    places: dict[str, tuple[Path, dict[str, str]]] = {}
    with Endpoint(latency_ms=args.latency_ms, tls=args.tls) as endpoint:
        url = endpoint.url
        trust = {"AWS_CA_BUNDLE": endpoint.ca} if endpoint.ca else {}
        rows: dict[str, list[str]] = {
            "floor: boto3 loop, receive 10 + delete batch 10": consumer("floor", url)
        }
        if "lean" in args.clients:
            rows["lean loop: SQSTransport, receive 10 + delete batch 10"] = consumer(
                "floor-lean", url
            )
        rows["sqsworker run, def: its defaults (10 threads, JSON logs, metrics)"] = deployed(
            "def", url
        )
        rows["sqsworker run, async def: --concurrency 256, JSON logs, metrics"] = deployed(
            "async", url
        )
        if args.pin_cpu:
            rows["sqsworker run, def: its defaults, --pin-cpu"] = deployed("def", url, "--pin-cpu")
            rows["sqsworker run, async def: --concurrency 256, --pin-cpu"] = deployed(
                "async", url, "--pin-cpu"
            )
        if against is not None:
            for kind, name in (("def", "def: its defaults"), ("async", "async def")):
                row = f"sqsworker run, {name}, at {args.against}"
                rows[row], places[row] = deployed(kind, url), against
        for client in args.clients:
            named = f", {client}" if client else ""
            rows[f"def, concurrency 16{named}"] = consumer("def", url, 16, client)
            rows[f"async def, concurrency 256{named}"] = consumer("async", url, 256, client)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in rows}
        for round_ in range(args.rounds):
            order = list(rows) if round_ % 2 == 0 else list(rows)[::-1]
            for name in order:
                cwd, env = places.get(name, (None, {}))
                result = measure(
                    rows[name],
                    endpoint,
                    warmup=args.warmup,
                    seconds=args.seconds,
                    env={**env, **trust},
                    cwd=cwd,
                )
                runs[name].append(result)
                print(
                    f"round {round_ + 1}, {name}: {result['rate']:.0f} msg/s, "
                    f"{result['cpu_us_per_message']:.0f} µs CPU a message",
                    flush=True,
                )
    fields = (
        "rate",
        "cpu_us_per_message",
        "system_us_per_message",
        "switches_per_message",
        "requests_per_message",
        "endpoint_cpu_us_per_message",
    )
    median: dict[str, dict[str, Any]] = {
        name: {f: statistics.median(r[f] for r in results) for f in fields}
        for name, results in runs.items()
    }
    floor = median[next(iter(rows))]["cpu_us_per_message"]
    print(
        f"\nendless endpoint, +{args.latency_ms:g} ms an answer, no-op handlers, medians of "
        f"{args.rounds} rounds of {args.seconds:g} s:\n"
    )
    print(
        "| | worker CPU µs/msg | / floor | of it, kernel | switches/msg | msg/s | requests/msg "
        "| endpoint CPU µs/msg |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, m in median.items():
        print(
            f"| {name} | {m['cpu_us_per_message']:.0f} | {m['cpu_us_per_message'] / floor:.2f} "
            f"| {m['system_us_per_message']:.0f} | {m['switches_per_message']:.2f} "
            f"| {m['rate']:.0f} | {m['requests_per_message']:.3f} "
            f"| {m['endpoint_cpu_us_per_message']:.0f} |"
        )


if __name__ == "__main__":
    main()
