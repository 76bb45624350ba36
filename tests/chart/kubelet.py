"""Run what the chart renders the way a kubelet would, without a container runtime.

The Deployment's container becomes a local process: the image's entrypoint and
environment (read from the Dockerfiles, with the image's paths mapped onto this
checkout and its virtual environment), the rendered args, env and ports. Its probes
are driven exactly as rendered: the startup probe first, then readiness and
liveness on their own periods, each with its timeout and thresholds. A pod is
ready only while its readiness probe passes; a liveness failure restarts the
container (SIGTERM, then SIGKILL at the grace period), and so does a startup
probe that never passes. Deleting a pod takes it out of service at once, sends
SIGTERM, and SIGKILL if it is still running at terminationGracePeriodSeconds.
``rolling_update`` replaces pods as the Deployment controller does, within the
rendered maxSurge and maxUnavailable.

The one liberty: a pod has its own network namespace, so every pod's worker can
listen on 0.0.0.0 at the same port. Here each pod gets its own loopback address
(127.0.0.2, 127.0.0.3, ...) and listens there, at the rendered port.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent.parent
# The image's folders, as the Dockerfiles lay them out, and where they are here.
IMAGE_PATHS = {"/opt/sqsworker": str(VENV), "/app": str(ROOT)}


# -- the image ---------------------------------------------------------------------------


@dataclass
class Image:
    entrypoint: list[str] = field(default_factory=list)
    cmd: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    workdir: str = "/"


def image(*dockerfiles: Path) -> Image:
    """The entrypoint, command, environment and workdir of the image these Dockerfiles
    build, each FROM the one before (only their final stages count)."""
    built = Image()
    for dockerfile in dockerfiles:
        for instruction, argument in _final_stage(dockerfile.read_text()):
            if instruction == "ENTRYPOINT":
                built.entrypoint, built.cmd = json.loads(argument), []
            elif instruction == "CMD":
                built.cmd = json.loads(argument)
            elif instruction == "WORKDIR":
                built.workdir = argument
            elif instruction == "ENV":
                for pair in shlex.split(argument):
                    key, _, value = pair.partition("=")
                    built.env[key] = _expand(value, built.env)
    return built


def _final_stage(text: str) -> list[tuple[str, str]]:
    joined = text.replace("\\\n", " ")
    instructions = []
    for line in joined.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instruction, _, argument = line.partition(" ")
        if instruction.upper() == "FROM":
            instructions = []
        instructions.append((instruction.upper(), argument.strip()))
    return instructions


def _expand(value: str, env: dict[str, str]) -> str:
    for key, known in env.items():
        value = value.replace(f"${key}", known)
    return value


def _local(value: str) -> str:
    """An image path (or a PATH-like list of them) as a path of this machine."""
    parts = []
    for part in value.split(":"):
        for inside, here in IMAGE_PATHS.items():
            if part == inside or part.startswith(inside + "/"):
                part = here + part[len(inside) :]
        parts.append(part)
    return ":".join(parts)


# -- the pod spec ------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    path: str
    port: int
    initial_delay: float
    period: float
    timeout: float
    failure_threshold: int
    success_threshold: int

    @classmethod
    def rendered(cls, spec: dict[str, Any], ports: dict[str, int]) -> Probe:
        port = spec["httpGet"]["port"]
        return cls(
            path=spec["httpGet"]["path"],
            port=ports[port] if isinstance(port, str) else int(port),
            initial_delay=spec.get("initialDelaySeconds", 0),
            period=spec.get("periodSeconds", 10),
            timeout=spec.get("timeoutSeconds", 1),
            failure_threshold=spec.get("failureThreshold", 3),
            success_threshold=spec.get("successThreshold", 1),
        )

    def passes(self, host: str) -> bool:
        """One HTTP GET as the kubelet sends it: 200 to 399 within the timeout passes."""
        url = f"http://{host}:{self.port}{self.path}"
        try:
            with urllib.request.urlopen(url, timeout=self.timeout) as answer:
                return 200 <= answer.status < 400
        except urllib.error.HTTPError as error:
            return 200 <= error.code < 400
        except OSError:
            return False


@dataclass(frozen=True)
class PodSpec:
    command: list[str]
    env: dict[str, str]
    workdir: str
    grace: int
    startup: Probe | None
    liveness: Probe | None
    readiness: Probe | None


def pod_spec(deployment: dict[str, Any], built: Image) -> PodSpec:
    """The Deployment's (only) container, as this machine runs it."""
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert not container.get("envFrom"), "envFrom names objects this harness does not have"
    command = container.get("command") or built.entrypoint
    args = container.get("args") if "args" in container else built.cmd
    env = {key: _local(value) for key, value in built.env.items()}
    env["PATH"] = _local(built.env.get("PATH", "")).replace("$PATH", os.environ["PATH"])
    for variable in container.get("env", []):
        env[variable["name"]] = _expand(variable["value"], env)  # $(VAR) is not used here
    ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}

    def probe(name: str) -> Probe | None:
        spec = container.get(name)
        return Probe.rendered(spec, ports) if spec else None

    executable = _which(command[0], env["PATH"])
    return PodSpec(
        command=[executable, *command[1:], *args],
        env=env,
        workdir=_local(container.get("workingDir") or built.workdir),
        grace=int(pod.get("terminationGracePeriodSeconds", 30)),
        startup=probe("startupProbe"),
        liveness=probe("livenessProbe"),
        readiness=probe("readinessProbe"),
    )


def _which(name: str, path: str) -> str:
    if "/" in name:
        return _local(name)
    for folder in path.split(":"):
        candidate = Path(folder) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise FileNotFoundError(f"{name} is not on the image's PATH ({path})")


# -- pods --------------------------------------------------------------------------------


@dataclass
class Exit:
    """How a container ended after SIGTERM."""

    seconds: float  # from SIGTERM to exit
    code: int | None
    killed: bool  # SIGKILLed at the grace period


class Pod:
    """One pod: a container process and the kubelet's probes of it."""

    _addresses = iter(range(2, 255))

    def __init__(self, name: str, spec: PodSpec, logs: Path, port_env: str) -> None:
        self.name, self.spec = name, spec
        self.ip = f"127.0.0.{next(self._addresses)}"
        self.log_path = logs / f"{name}.log"
        self.port_env = port_env  # the variable naming the address the worker listens on
        self.restarts = 0
        self.exits: list[Exit] = []
        self._lock = threading.Condition()
        self._ready = False
        self._deleted = False
        self._process: subprocess.Popen[bytes] | None = None
        self._generation = 0  # one per container start; stale probe threads stop

    # -- what the controller and the tests read

    @property
    def ready(self) -> bool:
        with self._lock:
            return self._ready and not self._deleted

    @property
    def deleted(self) -> bool:
        with self._lock:
            return self._deleted

    def wait_ready(self, timeout: float) -> bool:
        with self._lock:
            return self._lock.wait_for(lambda: self._ready, timeout)

    def log_lines(self) -> Iterator[dict[str, Any]]:
        for line in self.log_path.read_text().splitlines():
            if line.startswith("{"):
                yield json.loads(line)

    # -- the kubelet

    def start(self) -> Pod:
        with self._lock:
            self._generation += 1
            generation = self._generation
            self._ready = False
            env = {**self.spec.env, "HOSTNAME": self.name, self.port_env: self.ip}
            with self.log_path.open("ab") as log:
                self._process = subprocess.Popen(
                    self.spec.command,
                    env=env,
                    cwd=self.spec.workdir,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
        threading.Thread(target=self._probe, args=(generation,), daemon=True).start()
        return self

    def delete(self) -> Exit:
        """Out of service at once, then SIGTERM, then SIGKILL at the grace period."""
        with self._lock:
            self._deleted = True
            self._ready = False
            self._generation += 1  # probes stop
        ended = self._terminate()
        return ended

    def kill(self) -> None:
        """SIGKILL, as a node lost would: for a test's cleanup."""
        with self._lock:
            self._deleted = True
            self._ready = False
            self._generation += 1
        if self._process is not None:
            self._process.kill()
            self._process.wait()

    def _terminate(self) -> Exit:
        process = self._process
        assert process is not None
        began = time.monotonic()
        process.send_signal(signal.SIGTERM)
        try:
            code: int | None = process.wait(self.spec.grace)
            killed = False
        except subprocess.TimeoutExpired:
            process.kill()
            code, killed = process.wait(), True
        ended = Exit(time.monotonic() - began, code, killed)
        self.exits.append(ended)
        return ended

    def _current(self, generation: int) -> bool:
        with self._lock:
            return generation == self._generation and not self._deleted

    def _restart(self, generation: int) -> None:
        """The kubelet restarts the container of a failed liveness or startup probe."""
        with self._lock:
            if generation != self._generation:
                return
            self._generation += 1
            self._ready = False
            self.restarts += 1
        self._terminate()
        if not self.deleted:
            self.start()

    def _set_ready(self, generation: int, ready: bool) -> None:
        with self._lock:
            if generation == self._generation:
                self._ready = ready
                self._lock.notify_all()

    def _probe(self, generation: int) -> None:
        """The startup probe until it passes, then readiness and liveness side by side."""
        startup = self.spec.startup
        if startup is not None and not self._run(generation, startup, lambda ok: None):
            self._restart(generation)
            return
        threads = []
        if self.spec.readiness is not None:
            readiness = self.spec.readiness
            threads.append(
                threading.Thread(
                    target=self._run,
                    args=(generation, readiness, lambda ok: self._set_ready(generation, ok)),
                    daemon=True,
                )
            )
        else:
            self._set_ready(generation, True)
        if self.spec.liveness is not None:
            liveness = self.spec.liveness

            def live() -> None:
                if not self._run(generation, liveness, lambda ok: None):
                    self._restart(generation)

            threads.append(threading.Thread(target=live, daemon=True))
        for thread in threads:
            thread.start()

    def _run(self, generation: int, probe: Probe, report: Callable[[bool], None]) -> bool:
        """Probe every period. A startup probe returns True at its first pass; any
        probe returns False after failure_threshold failures in a row (a readiness
        probe reports it and goes on), or when this container is gone."""
        is_startup = probe is self.spec.startup
        is_readiness = probe is self.spec.readiness
        if not self._wait(generation, probe.initial_delay):
            return True
        passes = failures = 0
        while self._current(generation):
            if probe.passes(self.ip):
                passes, failures = passes + 1, 0
                if passes >= probe.success_threshold:
                    report(True)
                    if is_startup:
                        return True
            else:
                passes, failures = 0, failures + 1
                if failures >= probe.failure_threshold:
                    report(False)
                    if not is_readiness:
                        return False
            if not self._wait(generation, probe.period):
                break
        return True

    def _wait(self, generation: int, seconds: float) -> bool:
        """Sleep a probe period; False once this container is gone."""
        deadline = time.monotonic() + seconds
        with self._lock:
            while generation == self._generation and not self._deleted:
                left = deadline - time.monotonic()
                if left <= 0:
                    return True
                self._lock.wait(left)
        return False


# -- the Deployment controller -----------------------------------------------------------


def scaled(value: int | str, replicas: int, round_up: bool) -> int:
    """maxSurge and maxUnavailable: a count, or a percentage of the replicas."""
    if isinstance(value, int):
        return value
    share = replicas * int(value.rstrip("%")) / 100
    return math.ceil(share) if round_up else math.floor(share)


@dataclass
class Rollout:
    replaced: list[tuple[str, Exit]] = field(default_factory=list)  # old pod, how it ended
    started: list[Pod] = field(default_factory=list)
    least_ready: int = 1 << 30  # the fewest ready pods at any moment
    most_pods: int = 0  # the most pods (ready or starting, not being deleted) at once
    seconds: float = 0.0


def rolling_update(
    old: list[Pod], new_pod: Callable[[], Pod], deployment: dict[str, Any], timeout: float
) -> Rollout:
    """Replace ``old`` with pods from ``new_pod`` within the Deployment's strategy: start
    new pods while under replicas + maxSurge, delete an old one whenever the ready pods
    without it are at least replicas - maxUnavailable."""
    replicas = deployment["spec"]["replicas"]
    strategy = deployment["spec"]["strategy"]["rollingUpdate"]
    surge = scaled(strategy["maxSurge"], replicas, round_up=True)
    unavailable = scaled(strategy["maxUnavailable"], replicas, round_up=False)
    assert surge + unavailable > 0, "a rollout with maxSurge 0 and maxUnavailable 0 cannot move"
    rollout = Rollout()
    began = time.monotonic()
    remaining = list(old)
    deleting: list[threading.Thread] = []

    def delete(pod: Pod) -> None:
        rollout.replaced.append((pod.name, pod.delete()))

    while remaining or len(rollout.started) < replicas:
        assert time.monotonic() - began < timeout, "the rollout did not finish"
        live = [p for p in [*remaining, *rollout.started] if not p.deleted]
        while len(live) < replicas + surge and len(rollout.started) < replicas:
            pod = new_pod().start()
            rollout.started.append(pod)
            live.append(pod)
        ready = sum(p.ready for p in live)
        rollout.least_ready = min(rollout.least_ready, ready)
        rollout.most_pods = max(rollout.most_pods, len(live))
        # Unready old pods go first: removing them costs no availability.
        for pod in sorted(remaining, key=lambda p: p.ready):
            if pod.ready:
                if ready - 1 < replicas - unavailable:
                    break
                ready -= 1
            remaining.remove(pod)
            thread = threading.Thread(target=delete, args=(pod,))
            thread.start()
            deleting.append(thread)
        threading.Event().wait(0.05)  # the controller's resync
    for pod in rollout.started:  # complete: every new pod available
        assert pod.wait_ready(max(0.0, began + timeout - time.monotonic())), pod.name
    for thread in deleting:
        thread.join()
    rollout.seconds = time.monotonic() - began
    return rollout
