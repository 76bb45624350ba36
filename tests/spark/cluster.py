"""A Spark standalone cluster on this machine, from pyspark's own jars, and drivers for it.

A master and two workers of one core each (``bin/spark-class ...deploy.master.Master``
and ``...deploy.worker.Worker``) on 127.0.0.1 and free ports, each worker with a work
directory of its own; each executor is a JVM of its own that a worker starts, its
current folder inside that worker's work directory. The workers start without AWS's
variables or PYTHONPATH: what an executor sees comes from ``spark.executorEnv.*``,
as on a real cluster.

A query's driver runs in a process of its own (``cluster_driver.py``): pytest's JVM
already holds a ``local[2]`` context, and a driver is killed and restarted in tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import pyspark

ROOT = Path(__file__).resolve().parents[2]  # the checkout: executors import from it
HOME = Path(pyspark.__file__).parent
EXECUTOR_MEMORY = "512m"


def worker_python() -> str:
    """The Python for Spark's Python workers: this one, importing pyspark as installed.

    Spark puts its own ``pyspark.zip`` (and py4j's) first on a worker's path, and
    zipimport keeps no bytecode, so every worker start compiled pyspark again: 1.3 s of
    CPU against 0.45 s from the installed package (measured), for each of the several
    Python processes Spark starts for a query. The same pyspark is installed beside this
    Python; the script drops the zips from ``PYTHONPATH`` and runs it.
    """
    script = Path(sys.executable).with_name("python-spark-worker")
    text = (
        "#!/bin/sh\n"
        "PYTHONPATH=$(printf '%s' \"$PYTHONPATH\" | tr ':' '\\n' "
        "| grep -v -e '/pyspark\\.zip$' -e '/py4j-[^/]*\\.zip$' | paste -sd: -)\n"
        "export PYTHONPATH\n"
        f'exec "{sys.executable}" "$@"\n'
    )
    if not script.exists() or script.read_text() != text:
        staged = script.with_name(f".{script.name}.{os.getpid()}")
        staged.write_text(text)
        staged.chmod(0o755)
        staged.replace(script)  # two test processes may write it at once
    return str(script)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _daemon_env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "PYSPARK_", "SPARK_")) and k != "PYTHONPATH"
    }
    env.update(
        SPARK_HOME=str(HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_DAEMON_MEMORY="256m",
        SPARK_NO_DAEMONIZE="1",
    )
    return env


class StandaloneCluster:
    def __init__(self, root: Path, workers: int = 2) -> None:
        self.root = root
        self.port = free_port()
        self.ui_port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.workers: list[subprocess.Popen[bytes]] = []
        self.master: subprocess.Popen[bytes] | None = None
        self._count = workers
        self._logs: list[IO[bytes]] = []

    def _start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        out = open(self.root / f"{name}.log", "wb")  # noqa: SIM115 (closed in stop())
        self._logs.append(out)
        return subprocess.Popen(
            [str(HOME / "bin" / "spark-class"), *args],
            env=_daemon_env(),
            cwd=self.root,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def start(self, timeout: float = 90.0) -> StandaloneCluster:
        self.master = self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--webui-port",
            str(self.ui_port),
        )
        for n in range(self._count):
            work = self.root / f"worker-{n}"
            work.mkdir()
            self.workers.append(
                self._start(
                    f"worker-{n}",
                    "org.apache.spark.deploy.worker.Worker",
                    self.url,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(free_port()),
                    "--webui-port",
                    str(free_port()),
                    "--cores",
                    "1",
                    "--memory",
                    "1g",
                    "--work-dir",
                    str(work),
                )
            )
        deadline = time.monotonic() + timeout
        while self.alive_workers() < self._count:
            for process in [self.master, *self.workers]:
                if process.poll() is not None:
                    raise RuntimeError(f"a cluster process ended: see {self.root}/*.log")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not come up in {timeout} s: {self.root}")
            time.sleep(0.2)  # the master's own page is the only way to ask
        return self

    def state(self) -> dict[str, Any]:
        url = f"http://127.0.0.1:{self.ui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as answer:
            state: dict[str, Any] = json.loads(answer.read())
            return state

    def alive_workers(self) -> int:
        try:
            return sum(w["state"] == "ALIVE" for w in self.state()["workers"])
        except (OSError, ValueError):  # not up yet: no answer, or its page before its JSON
            return 0

    def executors(self) -> list[int]:
        """The pids of the executor JVMs the workers run now."""
        workers = {w.pid for w in self.workers}
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                status = (entry / "status").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            ppid = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("PPid")))
            if ppid in workers and b"CoarseGrainedExecutorBackend" in cmdline:
                found.append(int(entry.name))
        return sorted(found)

    def stop(self) -> None:
        for process in [*self.workers, self.master]:
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in [*self.workers, self.master]:
            if process is None:
                continue
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for out in self._logs:
            out.close()


class Driver:
    """``cluster_driver.py`` in a process (and session) of its own; its output in a file."""

    def __init__(self, log: Path, config: Mapping[str, Any], env: Mapping[str, str]) -> None:
        self.log = log
        self._out = open(log, "ab")  # noqa: SIM115 (closed in wait() and kill())
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.spark.cluster_driver", json.dumps(dict(config))],
            cwd=ROOT,
            # Its Python workers, and the executors' (spark.executorEnv), run this Python.
            env={**os.environ, **env, "PYTHONPATH": str(ROOT), "PYSPARK_PYTHON": worker_python()},
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def batches_done(self) -> int:
        return self.output().count("BATCH DONE")

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        finally:
            self._out.close()

    def first_batch_done(self) -> bool:
        """Whether a batch with rows is done; raises if the driver ended before one was."""
        if self.batches_done() >= 1:
            return True
        if self.process.poll() is not None:
            raise AssertionError(f"the driver ended before a batch: {self.output()[-3000:]}")
        return False

    def kill(self) -> None:
        """SIGKILL the driver and every process it started (its JVM, its Python workers)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self._out.close()

    def __enter__(self) -> Driver:
        return self

    def __exit__(self, *exc: object) -> None:
        """A driver a failed test left running is killed."""
        if self.process.poll() is None:
            self.kill()
        self._out.close()
