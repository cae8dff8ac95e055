"""Why a visited request is Blocked (the paper's Ready / Blocked / Other).

Ready and Other need no record: Ready is native admission's CONTINUE, Other every native
non-CONTINUE result with native handling. Blocked carries the producer and the depth waited for.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Blocking:
    """Why a consumer is Blocked: which producer, and at which depth it will publish."""

    producer: str  # producer rid
    depth: int  # publish depth the consumer waits for
    ready: int  # the consumer's ready prefix now
    fork: bool  # True when the producer must be moved to publish at the fork point
    # NOTE: a learned boundary below the fork the cut may go to instead (`Producer.mark`),
    # when waiting for it still wins (`Traversal.decide`, `placed`)
    mark: int | None = None
