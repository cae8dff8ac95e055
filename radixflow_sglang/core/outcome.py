"""Readiness outcomes of one visited request (the paper's Ready / Blocked / Other)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Outcome(StrEnum):
    READY = "ready"  # the native admission accepted it
    BLOCKED = "blocked"  # a live producer will publish a longer ready prefix: park it
    OTHER = "other"  # every native non-CONTINUE result, skip or break


@dataclass(frozen=True)
class Blocking:
    """Why a consumer is Blocked: which producer, and at which depth it will publish."""

    producer: str  # producer rid
    depth: int  # publish depth the consumer waits for
    ready: int  # the consumer's ready prefix now
    fork: bool  # True when the producer must be moved to publish at the fork point
