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
from collections.abc import Callable, Hashable
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
    # the chance another request of the oldest held one's burst follows (`Followers.more`;
    # rank-identical)
    followers: float = 0.0
    heads: int = 1  # held requests that head a burst of their own (distinct questions)
    # tokens a follower of the oldest held request would recompute beside it in one round:
    # that request's extend past its cached prefix (None: `mean_extend`; rank-identical)
    follower_extend: float | None = None
    # the followers its burst ends with when more come (`Followers.size`; rank-identical)
    burst_size: float = 1.0


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
    join = _join(c, mean_extend)
    burst = max(burst, 1.0)
    return rate / burst * (c.alpha - held * burst * join) - held


def burst_gain(heads: int, more: float, wait_left: float, mean_extend: float,
               c: CostCoeffs, follower_extend: float | None = None,
               size: float = 1.0) -> float:
    """Net latency (s) holding the rest of the wait saves when another request of the oldest
    held request's burst follows with probability `more` (`Followers.more`). A burst is one
    question (its latency is its last request's, as core/cost.py `RoundView.tied`): released
    now, its held requests run alone and a follower, arriving during that forward, in a round
    of its own after it, reusing their state; held until they come (at most `wait_left`), all
    run in one round, where its `size` followers each recompute the shared prefix
    (`follower_extend` tokens): the question saves a round's fixed cost alpha and pays that
    work. Where the work costs more than the round, the traversal makes the followers wait for
    the state (core/cost.py `group_wait_wins`): a round later either way, so holding saves
    nothing. The question pays the wait; each other held question (`heads` - 1) pays the wait
    and a follower's work. Positive: holding wins."""
    if more <= 0 or wait_left <= 0:
        return 0.0
    own = _join(c, mean_extend if follower_extend is None else follower_extend)
    saved = max(c.alpha - max(size, 1.0) * own, 0.0)
    return more * saved - wait_left - (heads - 1) * (wait_left + more * _join(c, mean_extend))


def _join(c: CostCoeffs, extend: float) -> float:
    """What one request of `extend` tokens adds to a round (work, row, attention pairs)."""
    return c.beta * extend + c.gamma + c.delta * extend * extend / 2


# NOTE: not measured; chosen as enough closed heads for `more` to move in steps of ~3 % while
# it still follows a change of workload within a few dozen questions
FOLLOWERS_WINDOW = 32  # closed heads whose follower counts `Followers.more` reads


@dataclass
class _Window:
    """One head's followers while they are counted (`Followers`)."""

    head: str  # the head's rid
    came: int  # the pass it registered in
    count: int = 0  # followers so far
    held: bool = False  # a hold kept it waiting
    selected: bool = False  # a round took it (counted until the next pass)


class Followers:
    """Requests that follow an arrival (its head), sharing its first tokens: a question's
    other branches, the other samples of an n > 1 request, a fork's siblings. A client sends
    them at once, but HTTP and the tokenizer pass them to the scheduler ~1 ms apart, so the
    head often finds an idle scheduler alone and its round runs before they register; the
    arrival rate (`hold_gain`) counts whole questions and cannot expect them.

    A head's followers are counted until: the end of its own pass, where some came with it
    (the burst arrived together); its selection, where a hold held it (what came while it
    waited: exact); else the first pass after its round (what came during that forward).
    `more(n)`: of the last `window` heads alone at their own pass with at least n followers,
    the share that had more (0 before any). Learned from registrations, holds and selections,
    which every tensor-parallel rank sees alike."""

    def __init__(self, window: int = FOLLOWERS_WINDOW) -> None:
        self._open: dict[Hashable, _Window] = {}  # by burst key
        self._heads: dict[str, Hashable] = {}  # head rid -> its key, until selected
        self._counts: deque[int] = deque(maxlen=window)  # followers of each closed head
        self._pass = 0

    def arrived(self, rid: str, key: Hashable) -> None:
        """A newly registered request: a follower of the open head with its key, else a head."""
        w = self._open.get(key)
        if w is not None:
            w.count += 1
        else:
            self._open[key] = _Window(rid, self._pass)
            self._heads[rid] = key

    def held(self, key: Hashable) -> None:
        """A hold keeps the head with `key` waiting: its followers are those it waits for."""
        w = self._open.get(key)
        if w is not None:
            w.held = True

    def selected(self, rid: str) -> None:
        """A round took `rid` (or it left the queue): a held head's count ends; another's
        goes on until the next pass."""
        key = self._heads.pop(rid, None)
        if key is not None:
            w = self._open[key]
            if w.held:
                self._close(key)
            else:
                w.selected = True

    def passed(self) -> None:
        """A pass registered its arrivals: close the heads selected before it and those whose
        burst came with them. NOTE: only a head alone at its own pass is ever asked `more`
        (a burst that came together is closed here, before the gate asks), so only such
        heads are learned from: siblings that arrive together after a lone first one
        completes must not make that lone one expect followers (issue 51: the sibling
        shape's p99)."""
        done = [(k, w.selected) for k, w in self._open.items()
                if w.selected or (w.came == self._pass and w.count and not w.held)]
        for key, selected in done:
            self._close(key, learn=selected)  # NOTE: else it came together: closed unasked
        self._pass += 1

    def _close(self, key: Hashable, learn: bool = True) -> None:
        w = self._open.pop(key)
        self._heads.pop(w.head, None)  # NOTE: still there when it closes unselected
        if learn:
            self._counts.append(w.count)

    def open(self) -> int:
        """Heads still queued whose followers are counted (0 once every request has left the
        queue). NOTE: a selected head's window holds no request and closes at the next pass;
        counting it made an idle kit whose last round ended its run read a stale record."""
        return sum(1 for w in self._open.values() if not w.selected)

    def more(self, key: Hashable) -> float:
        """The chance another follower comes to the open, unselected head with `key` (0: none
        open): the share of past heads with as many followers as it has so far that had
        more."""
        w = self._open.get(key)
        if w is None or w.selected:
            return 0.0
        n = w.count
        reached = sum(1 for c in self._counts if c >= n)
        return sum(1 for c in self._counts if c > n) / reached if reached else 0.0

    def size(self, key: Hashable) -> float:
        """The followers the open head with `key` ends with when more come: the mean count of
        the past heads that had more than it has so far (0: none)."""
        w = self._open.get(key)
        more = [c for c in self._counts if w is not None and c > w.count]
        return sum(more) / len(more) if more else 0.0


# NOTE: the paper's flexible-admission bound D (5 ms); the flex policies' default, a user flag
# (`--radixflow-admission-ms`, core/policy.py)
HOLD_MS = 5.0


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
                d.cost is None or self._holding_loses(d, now)):
            return Decision(False, Reason.COST)
        if now - d.oldest_arrival >= self.deadline_s and enabled(Reason.DEADLINE):
            return Decision(False, Reason.DEADLINE)
        return Decision(True, Reason.HOLD)

    def _holding_loses(self, d: Demand, now: float) -> bool:
        """Neither an arrival at the recent rate (`hold_gain`) nor the rest of the oldest held
        request's burst (`burst_gain`) repays holding on."""
        wait_left = self.deadline_s - (now - d.oldest_arrival)
        return (hold_gain(d.held, d.rate, d.mean_extend, d.cost, d.burst) <= 0
                and burst_gain(d.heads, d.followers, wait_left, d.mean_extend, d.cost,
                               d.follower_extend, d.burst_size) <= 0)

    def wake_in(self, d: Demand, now: float) -> float:
        """Seconds until the deadline: the loop may sleep this long, never past it."""
        return max(0.0, d.oldest_arrival + self.deadline_s - now)


# NOTE: not measured; chosen as a few seconds: several arrivals at a request a second, and a
# rate change followed within seconds
ARRIVAL_WINDOW_S = 5.0
# NOTE: the first arrivals of a run must not read as an infinite rate
# (notes/2026-11-admission-hold.md)
ARRIVAL_FLOOR_S = 0.5


class ArrivalRate:
    """Requests registered per second over the last `window_s` seconds (at least `min_s`, so
    the first arrivals of a run do not read as an infinite rate). Deterministic for a given
    sequence of (time, length) registrations."""

    def __init__(self, window_s: float = ARRIVAL_WINDOW_S,
                 min_s: float = ARRIVAL_FLOOR_S) -> None:
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
