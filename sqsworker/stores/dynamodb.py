"""``dynamodb://table``: records in a DynamoDB table, shared by every worker on AWS.

The table: partition key ``key`` (String), on-demand capacity, and DynamoDB's
time to live on the ``ttl`` attribute so old records go away by themselves.
``sqsworker create-store dynamodb://TABLE`` makes it. Every change is one
conditional write, so two workers can never both take a key.

Item: ``key``, ``state`` (in_progress | completed), ``owner``, ``digest``,
``expires_at`` (epoch seconds, fractional: what the conditions compare) and
``ttl`` (the same, whole seconds, for DynamoDB's sweeper, which may lag by days).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any, cast

import boto3
import botocore.exceptions
from botocore.config import Config

from ..errors import StartupError, StoreError
from .base import Lease, Record, State
from .urls import StoreURL

KEY = "key"
TTL_ATTRIBUTE = "ttl"


class DynamoDBStore:
    def __init__(self, client: Any, table: str, url: str) -> None:
        self.client = client
        self.table = table
        self.url = url

    @classmethod
    def open(
        cls,
        url: StoreURL,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        create: bool = False,
    ) -> DynamoDBStore:
        # boto3 reads AWS_DEFAULT_REGION only; AWS_REGION is what most AWS tools set.
        region = url.options.get("region") or region or os.environ.get("AWS_REGION") or None
        endpoint_url = url.options.get("endpoint") or endpoint_url
        # Every call ends within about 30 s, retries included: well inside the time a
        # claim has left when its renewal goes (idempotency.STORE_CALL_LIMIT).
        config = Config(
            connect_timeout=3,
            read_timeout=5,
            retries={"mode": "standard", "max_attempts": 3},
            max_pool_connections=64,
        )
        try:
            client = boto3.client(
                "dynamodb", region_name=region, endpoint_url=endpoint_url, config=config
            )
        except botocore.exceptions.NoRegionError:
            raise StartupError(
                f"the idempotency store {url.url} needs an AWS region: pass --region, set "
                "AWS_REGION, or add ?region=NAME to the URL"
            ) from None
        store = cls(client, url.location, url.url)
        if create:
            store.create_table()
        store.check()
        return store

    def _fail(self, exc: Exception) -> StoreError:
        return StoreError(f"DynamoDB table {self.table}: {_describe(exc)}")

    def check(self) -> None:
        """Raise ``StartupError`` unless the table exists with the expected key."""
        try:
            table = self.client.describe_table(TableName=self.table)["Table"]
        except botocore.exceptions.ClientError as exc:
            if exc.response["Error"]["Code"] == "ResourceNotFoundException":
                raise StartupError(
                    f"the DynamoDB table {self.table!r} of the idempotency store does not "
                    f"exist in {self.client.meta.region_name}: create it with "
                    f"`sqsworker create-store {self.url}`"
                ) from None
            raise StartupError(
                f"the idempotency store {self.url} cannot be used: {_describe(exc)}"
            ) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise StartupError(
                f"the idempotency store {self.url} cannot be used: {_describe(exc)}"
            ) from None
        key = [k for k in table["KeySchema"] if k["KeyType"] == "HASH"]
        if [k["AttributeName"] for k in key] != [KEY] or len(table["KeySchema"]) != 1:
            raise StartupError(
                f"the DynamoDB table {self.table!r} must have the single partition key "
                f"{KEY!r} (String); create one with `sqsworker create-store {self.url}`"
            )

    def create_table(self) -> None:
        try:
            self.client.create_table(
                TableName=self.table,
                KeySchema=[{"AttributeName": KEY, "KeyType": "HASH"}],
                AttributeDefinitions=[{"AttributeName": KEY, "AttributeType": "S"}],
                BillingMode="PAY_PER_REQUEST",
            )
            self.client.get_waiter("table_exists").wait(TableName=self.table)
            self.client.update_time_to_live(
                TableName=self.table,
                TimeToLiveSpecification={"Enabled": True, "AttributeName": TTL_ATTRIBUTE},
            )
        except botocore.exceptions.ClientError as exc:
            if _code(exc) == "ResourceInUseException":
                return  # it exists: check() tells whether it has the right key
            raise StartupError(
                f"the DynamoDB table {self.table!r} could not be created: {_describe(exc)}"
            ) from None
        except botocore.exceptions.BotoCoreError as exc:
            raise StartupError(
                f"the DynamoDB table {self.table!r} could not be created: {_describe(exc)}"
            ) from None

    # -- the Store protocol ----------------------------------------------------------------

    def claim(
        self, key: str, owner: str, digest: str, expires_at: float, now: float
    ) -> Record | None:
        try:
            self.client.put_item(
                TableName=self.table,
                Item=_item(key, State.IN_PROGRESS, owner, digest, expires_at),
                ConditionExpression="attribute_not_exists(#k) OR expires_at <= :now",
                ExpressionAttributeNames={"#k": KEY},
                ExpressionAttributeValues={":now": _number(now)},
                ReturnValuesOnConditionCheckFailure="ALL_OLD",
            )
            return None
        except botocore.exceptions.ClientError as exc:
            old: dict[str, Any] | None = cast(dict[str, Any], exc.response).get("Item")
            if _code(exc) != "ConditionalCheckFailedException" or old is None:
                raise self._fail(exc) from exc
            return _record(old)
        except botocore.exceptions.BotoCoreError as exc:
            raise self._fail(exc) from exc

    def renew(self, leases: Sequence[Lease]) -> list[str]:
        lost = []
        for lease in leases:  # DynamoDB has no batch of conditional updates but transactions
            try:
                self.client.update_item(
                    TableName=self.table,
                    Key={KEY: {"S": lease.key}},
                    UpdateExpression="SET expires_at = :e, #t = :t",
                    ConditionExpression="#o = :o AND #s = :s",
                    ExpressionAttributeNames={"#o": "owner", "#s": "state", "#t": TTL_ATTRIBUTE},
                    ExpressionAttributeValues={
                        ":e": _number(lease.expires_at),
                        ":t": _number(math.ceil(lease.expires_at)),
                        ":o": {"S": lease.owner},
                        ":s": {"S": State.IN_PROGRESS.value},
                    },
                    ReturnValuesOnConditionCheckFailure="ALL_OLD",
                )
            except botocore.exceptions.ClientError as exc:
                if _code(exc) != "ConditionalCheckFailedException":
                    raise self._fail(exc) from exc
                old: dict[str, Any] | None = cast(dict[str, Any], exc.response).get("Item")
                if old is not None and _completed_by(old, lease.owner):
                    continue  # completed by this owner while the renewal went: not lost
                lost.append(lease.key)
            except botocore.exceptions.BotoCoreError as exc:
                raise self._fail(exc) from exc
        return lost

    def complete(self, key: str, owner: str, digest: str, expires_at: float, now: float) -> bool:
        try:
            self.client.put_item(
                TableName=self.table,
                Item=_item(key, State.COMPLETED, owner, digest, expires_at),
                ConditionExpression="attribute_not_exists(#k) OR #o = :o OR expires_at <= :now",
                ExpressionAttributeNames={"#k": KEY, "#o": "owner"},
                ExpressionAttributeValues={":o": {"S": owner}, ":now": _number(now)},
            )
            return True
        except botocore.exceptions.ClientError as exc:
            if _code(exc) == "ConditionalCheckFailedException":
                return False
            raise self._fail(exc) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise self._fail(exc) from exc

    def release(self, key: str, owner: str) -> None:
        try:
            self.client.delete_item(
                TableName=self.table,
                Key={KEY: {"S": key}},
                ConditionExpression="#o = :o AND #s = :s",
                ExpressionAttributeNames={"#o": "owner", "#s": "state"},
                ExpressionAttributeValues={
                    ":o": {"S": owner},
                    ":s": {"S": State.IN_PROGRESS.value},
                },
            )
        except botocore.exceptions.ClientError as exc:
            if _code(exc) != "ConditionalCheckFailedException":  # not ours: leave it be
                raise self._fail(exc) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise self._fail(exc) from exc

    def close(self) -> None:
        self.client.close()


def _number(value: float) -> dict[str, str]:
    return {"N": repr(float(value)) if not isinstance(value, int) else str(value)}


def _item(key: str, state: State, owner: str, digest: str, expires_at: float) -> dict[str, Any]:
    return {
        KEY: {"S": key},
        "state": {"S": state.value},
        "owner": {"S": owner},
        "digest": {"S": digest},
        "expires_at": _number(expires_at),
        TTL_ATTRIBUTE: _number(math.ceil(expires_at)),
    }


def _record(item: dict[str, Any]) -> Record:
    return Record(
        State(item["state"]["S"]),
        item["owner"]["S"],
        item["digest"]["S"],
        float(item["expires_at"]["N"]),
    )


def _completed_by(item: dict[str, Any], owner: str) -> bool:
    record = _record(item)
    return record.state is State.COMPLETED and record.owner == owner


def _code(exc: botocore.exceptions.ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _describe(exc: Exception) -> str:
    if isinstance(exc, botocore.exceptions.ClientError):
        error = exc.response.get("Error", {})
        return f"{error.get('Code', 'error')}: {error.get('Message', exc)}"
    if isinstance(exc, botocore.exceptions.NoCredentialsError):
        return "no AWS credentials were found"
    return str(exc)
