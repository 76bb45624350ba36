"""The docs and the dashboard name exactly the metrics the worker exports."""

from __future__ import annotations

import json
import re

from sqsworker import Worker, WorkerConfig
from sqsworker.metrics import Metrics
from sqsworker.transports.memory import MemorySQS

from ..snippets import ROOT, snippet


def exported() -> set[str]:
    """Every series name the worker exports, as Prometheus sees it."""
    memory = MemorySQS()
    memory.create_queue("jobs")
    worker = Worker(lambda m: None, WorkerConfig(queue="jobs"), transport=memory.transport("jobs"))
    metrics = Metrics("jobs", "h")
    metrics.watch(worker)
    names = set()
    for family in metrics.registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_count", "_sum"]}
        names |= {family.name + s for s in suffixes.get(family.type, [""])}
    return names


def test_the_observability_page_documents_every_metric() -> None:
    page = (ROOT / "docs" / "observability.md").read_text()
    documented = set(re.findall(r"^\| `(sqsworker_\w+)`", page, re.M))
    names = exported()
    shown = {n for n in names if not n.endswith(("_bucket", "_count", "_sum"))}
    shown |= {n.removesuffix("_bucket") for n in names if n.endswith("_bucket")}
    assert documented == shown


def test_the_dashboard_queries_only_exported_metrics() -> None:
    dashboard = json.loads((ROOT / "helm/sqsworker/dashboards/sqsworker.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {name for expr in exprs for name in re.findall(r"sqsworker_\w+", expr)}
    assert used and used <= exported(), used - exported()


def test_the_observability_page_queries_only_exported_metrics() -> None:
    queries = snippet("docs/observability.md", "sum by (queue)").text
    used = set(re.findall(r"sqsworker_\w+", queries))
    assert used and used <= exported(), used - exported()


def test_the_iam_policy_file_is_the_one_the_deployment_page_shows() -> None:
    shown = snippet("docs/deployment.md", '"Version": "2012-10-17"').text
    policy = json.loads((ROOT / "docs" / "iam-policy.json").read_text())
    assert policy == json.loads(shown)
    actions = {a for s in policy["Statement"] for a in s["Action"]}
    assert {"sqs:ReceiveMessage", "sqs:DeleteMessage", "sqs:ChangeMessageVisibility"} <= actions
    # what DynamoDBStore calls: check() at start, then claim, renew, complete, release
    assert {
        "dynamodb:DescribeTable",
        "dynamodb:PutItem",
        "dynamodb:UpdateItem",
        "dynamodb:DeleteItem",
    } <= actions


def test_the_pointer_the_large_messages_page_shows_is_the_one_read() -> None:
    from sqsworker.payloads import SIZE_ATTRIBUTE, Pointer, pointer_of

    shown = snippet("docs/large-messages.md", "PayloadS3Pointer").text
    size = {SIZE_ATTRIBUTE: {"DataType": "Number", "StringValue": "2000000"}}
    assert pointer_of(shown, size) == Pointer(
        "video-bodies", "0b6f5c1e-6f4b-4a57-9d0c-2f1f3c1d9a77"
    )
