"""Payments charged once, with PostgreSQL: each payment's ledger row and its key's
completion commit in one transaction, so a payment sent twice, or redelivered after
a worker died between its commit and its delete, is charged once.

    sqsworker create-store 'postgresql://app@db.internal:5432/shop'    # once
    psql ... -c 'CREATE TABLE ledger (payment_id text PRIMARY KEY, cents integer)'
    sqsworker run examples.payments:charge \\
        --idempotency-store 'postgresql://app@db.internal:5432/shop'

The password comes from PGPASSWORD or ~/.pgpass (or the URL); see docs/idempotency.md.
A message's body: {"payment": {"id": "p-1", "cents": 1250}}.
"""

from __future__ import annotations

import sqsworker


@sqsworker.handler(queue="payments", idempotency_key="json:payment.id")
def charge(message: sqsworker.Message) -> None:
    payment = message.json()["payment"]
    with message.transaction() as db:  # a psycopg connection, inside a transaction
        db.execute(
            "INSERT INTO ledger (payment_id, cents) VALUES (%s, %s)",
            (payment["id"], payment["cents"]),
        )
