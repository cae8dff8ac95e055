"""Flexible admission and the timer controls: hold arrived work briefly so a round fills.

The paper's rule: an arrived request becomes eligible after at most D ms, and earlier when
(a) the worker already has work, (b) held requests fill the rows the round can take, or
(c) their residual token demand fills the round's token budget. Timer controls release only at
the deadline or when rows are full. The cost-aware flex hold (`Gate(..., cost_aware=True)`)
also releases at once when holding cannot win (`hold_wins`, docs/design.md "The admission
hold"). A decision reads a wall clock (the deadline, the arrival rate), which differs per
tensor-parallel rank, so the adapter shares rank 0's decision through `Agreement`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from radixflow_sglang.core.cost import CostCoeffs
from radixflow_sglang.core.reasons import Reason, enabled


@dataclass(frozen=True)
class Demand:
    """What the gate sees this iteration; every field but `oldest_arrival` and `rate` is
    identical on all TP ranks."""

    held: int  # requests waiting (>= 1: nothing is decided for none)
    oldest_arrival: float  # arrival time of the oldest waiting request (rank-local clock)
    busy: bool  # a running batch, a continuing chunk or an extend batch in flight
    free_rows: int  # rows this round can still take
    token_budget: int  # tokens this round can still take
    residual_tokens: int  # sum of (input length - ready prefix) over waiting requests
    rate: float = 0.0  # requests registered per second, recent window (rank-local clock)
    mean_extend: float = 0.0  # mean input length of recent arrivals (tokens)
    cost: CostCoeffs | None = None  # the round-cost fit (rank-identical)
    burst: float = 1.0  # requests per arrival: registered in the same pass (rank-local)


@dataclass(frozen=True)
class Decision:
    hold: bool
    reason: Reason  # the HOLD rule that decided (core/reasons.py, in the order `Gate` checks)
    count: int = -1  # how many held requests (queue order) it releases; -1 = all


def hold_gain(held: int, rate: float, mean_extend: float, c: CostCoeffs,
              burst: float = 1.0) -> float:
    """Net latency (s) per second of holding: the arrivals' saving less the held requests' wait.

    Holding dt more delays each of the `held` requests by dt. An arrival within dt (expected
    rate / burst * dt: `burst` requests arrive together, as one question's branches or one
    client batch reach the scheduler in one pass) joins this round instead of waiting for it
    and running in a round of its own: it saves that round's fixed cost alpha once, while its
    `burst` requests' work (beta * extend + gamma per row, delta for its attention pairs) now
    delays each held request. Positive: holding wins."""
    join = c.beta * mean_extend + c.gamma + c.delta * mean_extend * mean_extend / 2
    burst = max(burst, 1.0)
    return rate / burst * (c.alpha - held * burst * join) - held


class Gate:
    def __init__(self, mode: str, deadline_ms: float, *, cost_aware: bool = False) -> None:
        if mode not in ("flex", "timer"):
            raise ValueError(f"admission mode {mode!r}: choose flex or timer")
        self.mode = mode
        self.deadline_s = deadline_ms / 1000.0
        self.cost_aware = cost_aware and mode == "flex"  # NOTE: timers stay the paper's

    def decide(self, d: Demand, now: float) -> Decision:
        # NOTE: asked only with requests held (`d.held` >= 1: the adapter decides nothing for
        # an empty hold); `enabled`: an ablated rule (core/reasons.py) lets the next one decide
        # NOTE: rank-identical rules first; only cost and deadline read this rank's clock.
        flex = self.mode == "flex"
        if enabled(Reason.EARLY):  # NOTE: the paper's early release; the reason names its case
            if d.free_rows > 0 and d.held >= d.free_rows:
                return Decision(False, Reason.ROWS)
            if flex and d.busy:
                return Decision(False, Reason.BUSY)
            if flex and d.residual_tokens >= d.token_budget:
                return Decision(False, Reason.TOKENS)
        if self.cost_aware and enabled(Reason.COST) and (
                d.cost is None or hold_gain(d.held, d.rate, d.mean_extend, d.cost, d.burst) <= 0):
            return Decision(False, Reason.COST)
        if now - d.oldest_arrival >= self.deadline_s and enabled(Reason.DEADLINE):
            return Decision(False, Reason.DEADLINE)
        return Decision(True, Reason.HOLD)

    def wake_in(self, d: Demand, now: float) -> float:
        """Seconds until the deadline: the loop may sleep this long, never past it."""
        return max(0.0, d.oldest_arrival + self.deadline_s - now)


class ArrivalRate:
    """Requests registered per second over the last `window_s` seconds (at least `min_s`, so
    the first arrivals of a run do not read as an infinite rate). Deterministic for a given
    sequence of (time, length) registrations."""

    def __init__(self, window_s: float = 5.0, min_s: float = 0.5) -> None:
        self.window_s, self.min_s = window_s, min_s
        # NOTE: running totals make every read O(1) (a hold decision reads them each pass);
        # registrations come in clock order, so one arrival's requests are consecutive
        self._seen: deque[tuple[float, int]] = deque()
        self._groups: deque[list] = deque()  # [time, requests registered at it]
        self._length = 0  # summed lengths in the window
        self._first: float | None = None

    def add(self, t: float, length: int) -> None:
        if self._first is None:
            self._first = t
        self._seen.append((t, length))
        self._length += length
        if self._groups and self._groups[-1][0] == t:
            self._groups[-1][1] += 1
        else:
            self._groups.append([t, 1])

    def _prune(self, now: float) -> None:
        cut = now - self.window_s
        while self._seen and self._seen[0][0] <= cut:
            self._length -= self._seen.popleft()[1]
            g = self._groups[0]
            g[1] -= 1
            if not g[1]:
                self._groups.popleft()

    def rate(self, now: float) -> float:
        self._prune(now)
        if self._first is None:
            return 0.0
        span = min(self.window_s, max(self.min_s, now - self._first))
        return len(self._seen) / span

    def mean_length(self) -> float:
        return self._length / len(self._seen) if self._seen else 0.0

    def burst(self) -> float:
        """Requests per arrival in the window: those registered at one time (one pass) arrive
        together (1.0 before any)."""
        return len(self._seen) / len(self._groups) if self._seen else 1.0


Agreement = Callable[[Decision], Decision]  # shares one rank's decision with the others


def local_agreement(decision: Decision) -> Decision:
    return decision
