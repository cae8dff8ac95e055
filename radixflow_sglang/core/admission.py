"""Flexible admission and the timer controls: hold arrived work briefly so a round fills.

The paper's rule: an arrived request becomes eligible after at most D ms, and earlier when
(a) the worker already has work, (b) held requests fill the rows the round can take, or
(c) their residual token demand fills the round's token budget. Timer controls release only at
the deadline or when rows are full. A decision reads a wall clock, which differs per
tensor-parallel rank, so the adapter shares rank 0's decision through `Agreement`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Demand:
    """What the gate sees this iteration; every field is identical on all TP ranks."""

    held: int  # requests waiting
    oldest_arrival: float  # arrival time of the oldest waiting request (rank-local clock)
    busy: bool  # a running batch, a continuing chunk or an extend batch in flight
    free_rows: int  # rows this round can still take
    token_budget: int  # tokens this round can still take
    residual_tokens: int  # sum of (input length - ready prefix) over waiting requests


@dataclass(frozen=True)
class Decision:
    hold: bool
    reason: str  # why released (or "hold"): busy | rows | tokens | deadline | none
    count: int = -1  # how many held requests (queue order) it releases; -1 = all


class Gate:
    def __init__(self, mode: str, deadline_ms: float) -> None:
        if mode not in ("flex", "timer"):
            raise ValueError(f"admission mode {mode!r}: choose flex or timer")
        self.mode = mode
        self.deadline_s = deadline_ms / 1000.0

    def decide(self, d: Demand, now: float) -> Decision:
        if d.held == 0:
            return Decision(False, "none")
        # NOTE: rank-identical rules first; only the deadline reads this rank's clock.
        if d.free_rows > 0 and d.held >= d.free_rows:
            return Decision(False, "rows")
        if self.mode == "flex":
            if d.busy:
                return Decision(False, "busy")
            if d.residual_tokens >= d.token_budget:
                return Decision(False, "tokens")
        if now - d.oldest_arrival >= self.deadline_s:
            return Decision(False, "deadline")
        return Decision(True, "hold")

    def wake_in(self, d: Demand, now: float) -> float:
        """Seconds until the deadline: the loop may sleep this long, never past it."""
        return max(0.0, d.oldest_arrival + self.deadline_s - now)


Agreement = Callable[[Decision], Decision]  # shares one rank's decision with the others


def local_agreement(decision: Decision) -> Decision:
    return decision
