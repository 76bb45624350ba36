"""The Helm chart, rendered by the real helm binary and validated against real schemas.

Built-in kinds are checked with kubernetes-validate in strict mode (unknown fields
refused) for every Kubernetes version from 1.29 on that it knows. KEDA's and the
Prometheus Operator's kinds are checked against their CRDs' schemas, taken from
generated models and made strict the same way.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import all_versions

from sqsworker import config

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "sqsworker"
HELM = str(Path(sys.executable).parent / "helm")
REQUIRED = ["--set", "worker.handler=app:process", "--set", "worker.queue=orders"]
KEDA_API = ["--api-versions", "keda.sh/v1alpha1/ScaledObject"]
KEDA_ON = ["--set", "autoscaling.keda.enabled=true"]
REGION = ["--set", "worker.region=eu-west-1"]
MONITORING_API = ["--api-versions", "monitoring.coreos.com/v1"]
QUEUE_URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"
VERSIONS = sorted(
    {v for v in all_versions() if tuple(map(int, v.split(".")[:2])) >= (1, 29)},
    key=lambda v: tuple(map(int, v.split("."))),
)


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=60)


def render(*args: str) -> list[dict[str, Any]]:
    result = helm("template", "orders", str(CHART), *args)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def kinds(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in docs}


@cache
def crd_schema(kind: str) -> dict[str, Any]:
    """The CRD's schema for ``kind``, with unknown properties refused everywhere."""
    if kind in ("ScaledObject", "TriggerAuthentication"):
        import cloudcoil.models.keda.v1alpha1 as models
    else:
        import cloudcoil.models.prometheus_operator.v1 as models  # type: ignore[no-redef]
    schema: dict[str, Any] = getattr(models, kind).model_json_schema(by_alias=True)

    def strict(node: Any) -> None:
        if isinstance(node, dict):
            if "properties" in node and "additionalProperties" not in node:
                node["additionalProperties"] = False
            for value in node.values():
                strict(value)
        elif isinstance(node, list):
            for value in node:
                strict(value)

    strict(schema)
    schema["properties"]["metadata"] = {"type": "object"}  # ObjectMeta: checked by kind below
    return schema


def validate(doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith(("keda.sh/", "monitoring.coreos.com/")):
        jsonschema.validate(doc, crd_schema(doc["kind"]))
        return
    for version in VERSIONS:
        kubernetes_validate.validate(doc, version, strict=True)


@pytest.fixture(scope="module")
def everything_on() -> list[dict[str, Any]]:
    return render(
        *KEDA_API,
        *MONITORING_API,
        "--set", "worker.handler=app:process",
        "--set", f"worker.queue={QUEUE_URL}",
        "--set", "worker.region=eu-west-1",
        "--set", "autoscaling.keda.enabled=true",
        "--set", "metrics.podMonitor.enabled=true",
        "--set", "metrics.serviceMonitor.enabled=true",
        "--set", "metrics.dashboard.enabled=true",
        "--set", "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::1:role/w",
        "--set", "topologySpreadConstraints[0].maxSkew=1",
        "--set", "topologySpreadConstraints[0].topologyKey=topology.kubernetes.io/zone",
        "--set", "topologySpreadConstraints[0].whenUnsatisfiable=ScheduleAnyway",
        "--set", "topologySpreadConstraints[0].labelSelector.matchLabels.app=orders",
    )  # fmt: skip


def test_helm_lint_strict_passes() -> None:
    result = helm("lint", "--strict", str(CHART), "-f", str(CHART / "ci" / "test-values.yaml"))
    assert result.returncode == 0, result.stdout + result.stderr


def test_defaults_render_valid_manifests() -> None:
    docs = render(*REQUIRED)
    assert sorted(kinds(docs)) == ["Deployment", "PodDisruptionBudget", "ServiceAccount"]
    for doc in docs:
        validate(doc)


def test_keda_monitoring_and_dashboard_render_valid_manifests(
    everything_on: list[dict[str, Any]],
) -> None:
    found = kinds(everything_on)
    assert {"ScaledObject", "TriggerAuthentication", "PodMonitor", "ServiceMonitor"} <= set(found)
    assert "HorizontalPodAutoscaler" not in found
    for doc in everything_on:
        validate(doc)
    trigger = found["ScaledObject"]["spec"]["triggers"][0]
    assert trigger["type"] == "aws-sqs-queue"
    assert trigger["metadata"]["queueURLFromEnv"] == "SQSWORKER_QUEUE"
    assert trigger["metadata"]["scaleOnInFlight"] == "true"
    authentication = found["TriggerAuthentication"]
    assert trigger["authenticationRef"]["name"] == authentication["metadata"]["name"]
    assert authentication["spec"]["podIdentity"] == {
        "provider": "aws",
        "identityOwner": "workload",
    }
    assert "replicas" not in found["Deployment"]["spec"]  # KEDA owns the replica count
    dashboard = found["ConfigMap"]["data"]["sqsworker.json"]
    assert dashboard == (CHART / "dashboards" / "sqsworker.json").read_text().rstrip("\n")


def test_the_hpa_is_the_alternative_to_keda() -> None:
    docs = kinds(render(*REQUIRED, "--set", "autoscaling.hpa.enabled=true"))
    assert docs["HorizontalPodAutoscaler"]["spec"]["maxReplicas"] == 10
    validate(docs["HorizontalPodAutoscaler"])
    assert "replicas" not in docs["Deployment"]["spec"]


def test_the_pod_is_locked_down_and_probed(everything_on: list[dict[str, Any]]) -> None:
    pod = kinds(everything_on)["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["startupProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["args"] == ["run", "app:process"]
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "topology.kubernetes.io/zone"
    account = kinds(everything_on)["ServiceAccount"]["metadata"]["annotations"]
    assert account == {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/w"}


def test_every_worker_option_is_a_value_and_becomes_its_variable() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())["worker"]
    camel = {re.sub(r"_(\w)", lambda m: m[1].upper(), f.name): f.name for f in config.options()}
    del camel["burst"]  # a Deployment restarts a worker that exits: burst is for jobs
    assert set(values) - {"handler", "lambda"} == set(camel)
    settings = [arg for key in camel for arg in ("--set", f"worker.{key}={_sample(camel[key])}")]
    pod = kinds(render(*REQUIRED, *settings))["Deployment"]["spec"]["template"]["spec"]
    env = {e["name"] for e in pod["containers"][0]["env"]}
    assert env == {config.env_var(name) for name in camel.values()}


def _sample(field: str) -> str:
    samples = {"queue": "orders", "log_level": "info", "log_format": "json", "burst": "false"}
    samples |= {"endpoint_url": "http://sqs:4566", "region": "eu-west-1", "metrics_host": "0.0.0.0"}
    samples |= {"non_retryable": "app:Fatal", "log_bodies": "false", "metrics_port": "9000"}
    samples |= {"idempotency_store": "dynamodb://orders-keys", "idempotency_key": "json:order.id"}
    samples |= {"on_key_conflict": "reject", "payload_bucket": "orders-bodies"}
    samples |= {"delete_payloads": "false", "sqs_client": "boto3", "pin_cpu": "true"}
    return samples.get(field, "5")


def test_a_lambda_handler_runs_with_the_lambda_flag() -> None:
    pod = kinds(render(*REQUIRED, "--set", "worker.lambda=true"))["Deployment"]["spec"]
    container = pod["template"]["spec"]["containers"][0]
    assert container["args"][-1] == "--lambda"
    assert "SQSWORKER_LAMBDA" not in {e["name"] for e in container["env"]}  # a flag, not an option


def test_tracing_values_become_opentelemetrys_own_variables() -> None:
    def otel_env(*args: str) -> dict[str, str]:
        pod = kinds(render(*REQUIRED, *args))["Deployment"]["spec"]["template"]["spec"]
        env = pod["containers"][0]["env"]
        return {e["name"]: e["value"] for e in env if e["name"].startswith("OTEL_")}

    assert otel_env() == {}  # off unless asked for
    endpoint = "http://otel-collector.observability:4318"
    assert otel_env("--set", f"tracing.endpoint={endpoint}") == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "orders-sqsworker",  # the release's, when not named
    }
    chosen = otel_env(
        *("--set", f"tracing.endpoint={endpoint}", "--set", "tracing.serviceName=orders"),
        *(
            "--set",
            "tracing.sampler=parentbased_traceidratio",
            "--set-string",
            "tracing.samplerArg=0.1",
        ),
    )
    assert chosen == {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,
        "OTEL_SERVICE_NAME": "orders",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
    }


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({}, 60),  # 30 s shutdown + 20 s long poll + 10 s margin
        ({"worker.shutdownTimeout": "120"}, 150),
        ({"worker.waitTime": "0"}, 40),
        ({"terminationGracePeriodSeconds": "10"}, 60),  # never below what the worker needs
        ({"terminationGracePeriodSeconds": "600"}, 600),
    ],
)
def test_the_grace_period_covers_the_shutdown(settings: dict[str, str], expected: int) -> None:
    args = [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]
    pod = kinds(render(*REQUIRED, *args))["Deployment"]["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] == expected


ORDERS_URL = QUEUE_URL
EMAILS_URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/emails"
TWO_HANDLERS = [
    *("--set", "handlers[0].handler=app:orders", "--set", f"handlers[0].queue={ORDERS_URL}"),
    *("--set", "handlers[0].concurrency=20"),
    *("--set", "handlers[1].handler=app.jobs:send_email"),
    *("--set", f"handlers[1].queue={EMAILS_URL}", "--set", "handlers[1].shutdownTimeout=120"),
    *("--set", "handlers[1].queueLength=10"),
]


def test_several_handlers_run_in_one_deployment_and_keda_scales_on_every_queue() -> None:
    docs = kinds(render(*TWO_HANDLERS, *KEDA_API, *KEDA_ON, *REGION))
    for doc in docs.values():
        validate(doc)
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["args"] == ["run", "app:orders", "app.jobs:send_email"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["SQSWORKER_ORDERS__QUEUE"] == ORDERS_URL
    assert env["SQSWORKER_ORDERS__CONCURRENCY"] == "20"
    assert env["SQSWORKER_SEND_EMAIL__QUEUE"] == EMAILS_URL
    # worker.* left null sets nothing, so each handler's decorator holds.
    assert "SQSWORKER_CONCURRENCY" not in env and "SQSWORKER_VISIBILITY_TIMEOUT" not in env
    assert "SQSWORKER_QUEUE" not in env and "SQSWORKER_SEND_EMAIL__QUEUE_LENGTH" not in env
    # The handlers shut down side by side: the longest one counts (120 + 20 + 10).
    assert pod["terminationGracePeriodSeconds"] == 150
    triggers = docs["ScaledObject"]["spec"]["triggers"]
    assert [
        (t["name"], t["metadata"]["queueURLFromEnv"], t["metadata"]["queueLength"])
        for t in triggers
    ] == [
        ("orders", "SQSWORKER_ORDERS__QUEUE", "50"),
        ("send-email", "SQSWORKER_SEND_EMAIL__QUEUE", "10"),
    ]
    assert {t["metadata"]["awsRegion"] for t in triggers} == {"eu-west-1"}


def bad(*args: str) -> Iterator[str]:
    result = helm("template", "orders", str(CHART), *args)
    assert result.returncode != 0, "helm accepted bad values"
    yield result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "worker.handler=app:process"], "worker.queue"),
        (["--set", "worker.queue=orders"], "worker.handler"),
        ([*REQUIRED, *TWO_HANDLERS], "either worker.handler and worker.queue"),
        ([*TWO_HANDLERS, "--set", "handlers[0].metricsPort=9100"], "metricsPort"),
        ([*TWO_HANDLERS, "--set", "handlers[1].handler=other:orders"], "could not tell them"),
        ([*TWO_HANDLERS, "--set", f"handlers[1].queue={ORDERS_URL}"], "has the queue"),
        ([*TWO_HANDLERS, "--set", "handlers[1].handler=nocolon"], "handlers.1.handler"),
        (
            [*TWO_HANDLERS, *KEDA_API, *KEDA_ON, *REGION, "--set", "handlers[1].queue=emails"],
            "needs handlers[1].queue as a queue URL",
        ),
        ([*TWO_HANDLERS, *KEDA_API, *KEDA_ON], "handlers[0].region"),
        ([*REQUIRED, "--set", "worker.visibilityTimeout=50000"], "worker.visibilityTimeout"),
        ([*REQUIRED, "--set", "worker.visibilityTimeout=-1"], "worker.visibilityTimeout"),
        ([*REQUIRED, "--set", "worker.concurrency=0"], "worker.concurrency"),
        ([*REQUIRED, "--set", "worker.concurrency=-4"], "worker.concurrency"),
        ([*REQUIRED, "--set", "worker.idempotencyStore=redis://x"], "worker.idempotencyStore"),
        ([*REQUIRED, "--set", "worker.onKeyConflict=ignore"], "worker.onKeyConflict"),
        ([*REQUIRED, "--set", "worker.payloadBucket=Not_A_Bucket"], "worker.payloadBucket"),
        ([*REQUIRED, "--set", "tracing.endpoint=collector:4318"], "tracing.endpoint"),
        ([*REQUIRED, "--set", "tracing.sampler=sometimes"], "tracing.sampler"),
        ([*REQUIRED, "--set", "worker.handler=not-an-import-string"], "worker.handler"),
        ([*REQUIRED, "--set", "worker.visibilitytimeout=60"], "visibilitytimeout"),  # a typo
        (
            [*REQUIRED, *KEDA_API, *KEDA_ON],
            "needs worker.queue as a queue URL",
        ),
        (
            [*REQUIRED, *KEDA_API, *KEDA_ON, "--set", f"worker.queue={QUEUE_URL}"],
            "needs the queue's region",
        ),
        (
            [*REQUIRED, *KEDA_ON, "--set", f"worker.queue={QUEUE_URL}", *REGION],
            "install KEDA first",  # no KEDA in the cluster
        ),
    ],
)
def test_the_schema_refuses_bad_values(args: list[str], message: str) -> None:
    for stderr in bad(*args):
        assert message in stderr, stderr


def test_the_postgresql_values_of_the_deployment_page_render(tmp_path: Path) -> None:
    from ..snippets import snippet

    values = tmp_path / "values.yaml"
    values.write_text(snippet("docs/deployment.md", "secretRef").text)
    deployment = kinds(render(*REQUIRED, "-f", str(values)))["Deployment"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SQSWORKER_IDEMPOTENCY_STORE"].startswith("postgresql://orders@")
    assert ":" not in env["SQSWORKER_IDEMPOTENCY_STORE"].split("@")[0].removeprefix("postgresql:")
    assert container["envFrom"] == [{"secretRef": {"name": "orders-db"}}]
    validate(deployment)


def test_the_handlers_values_of_the_deployment_page_render(tmp_path: Path) -> None:
    from ..snippets import snippet

    values = tmp_path / "values.yaml"
    values.write_text(snippet("docs/deployment.md", "handlers:\n  - handler").text)
    docs = kinds(render("-f", str(values), *KEDA_API))
    for doc in docs.values():
        validate(doc)
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["args"] == ["run", "app.handlers:orders", "app.handlers:send_email"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SQSWORKER_SEND_EMAIL__VISIBILITY_TIMEOUT"] == "120"
    assert (env["SQSWORKER_CONCURRENCY"], env["SQSWORKER_ORDERS__CONCURRENCY"]) == ("8", "32")
    assert pod["terminationGracePeriodSeconds"] == 120  # as the page says
    triggers = docs["ScaledObject"]["spec"]["triggers"]
    assert [t["metadata"]["queueLength"] for t in triggers] == ["50", "20"]
