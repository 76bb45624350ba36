"""Small policies that users may want to change."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """How long a failed message waits before its next attempt.

    The n-th receive waits ``base * 2**(n-1)`` seconds, capped at ``maximum``, with
    "equal jitter": a random point in the upper half of that span, so retries of
    many messages that failed together spread out. With the defaults (2 s, 900 s):
    about 1-2 s, 2-4 s, 4-8 s, ... up to 7.5-15 min.

    Bounded for any receive count: SQS's count grows without limit on a queue with no
    redrive policy, and a server may report any number.
    """

    base: float = 2.0
    maximum: float = 900.0
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, receive_count: int) -> float:
        # 2**63 is past any maximum a float of seconds can mean: the exponent stops there.
        doublings = min(max(0, receive_count - 1), _MAX_DOUBLINGS)
        span = min(self.maximum, self.base * 2.0**doublings)
        return span / 2 + self.rng.uniform(0, span / 2)


_MAX_DOUBLINGS = 63
