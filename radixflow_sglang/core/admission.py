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

import math
from collections import deque
from collections.abc import Callable, Container, Hashable
from dataclasses import dataclass, field

from radixflow_sglang.core.cost import CostCoeffs
from radixflow_sglang.core.reasons import Reason, enabled


@dataclass(frozen=True)
class Demand:
    """What the gate sees this iteration; every field but `oldest_arrival` and `rate` is
    identical on all TP ranks."""

    held: int  # requests waiting (>= 1: nothing is decided for none)
    oldest_arrival: float  # arrival time of the oldest waiting request (rank-local clock)
    busy: bool  # a running batch, a continuing chunk or queued work this round runs
    free_rows: int  # rows this round can still take
    token_budget: int  # tokens this round can still take
    residual_tokens: int  # sum of (input length - ready prefix) over waiting requests
    rate: float = 0.0  # requests registered per second, recent window (rank-local clock)
    mean_extend: float = 0.0  # mean input length of recent arrivals (tokens)
    cost: CostCoeffs | None = None  # the round-cost fit (rank-identical)
    burst: float = 1.0  # requests per arrival: registered in the same pass (rank-local)
    # the chance another request of the oldest held one's burst comes before its hold's
    # deadline (`Followers.expect` `more`; rank-local clock)
    followers: float = 0.0
    heads: int = 1  # held requests that head a burst of their own (distinct questions)
    # tokens a follower of the oldest held request would recompute beside it in one round:
    # that request's extend past its cached prefix (None: `mean_extend`; rank-identical)
    follower_extend: float | None = None
    # the followers that join its held round when some come (`Expected.joined` / `more`)
    burst_size: float = 1.0
    # its followers expected after the deadline, during the round (`Expected.late`): holding
    # delays each
    late_followers: float = 0.0
    # when the oldest held request's burst last grew: its head's or its newest follower's
    # registration (`Followers.latest`; None: not a lone head's burst); a cost-aware hold's
    # deadline runs from it (`Gate.wait_left`; rank-local clock)
    burst_last: float | None = None


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
               size: float = 1.0, late: float = 0.0) -> float:
    """Net latency (s) holding the rest of the wait saves when another request of the oldest
    held request's burst comes before the deadline with probability `more`
    (`Followers.expect`). A burst is one question (its latency is its last request's, as
    core/cost.py `RoundView.tied`): released now, its held requests run alone and a follower,
    arriving during that forward, in a round of its own after it, reusing their state; held
    until they come (at most `wait_left`), all run in one round, where its `size` followers
    each recompute the shared prefix (`follower_extend` tokens): the question saves a round's
    fixed cost alpha and pays that work. Where the work costs more than the round, the
    traversal makes the followers wait for the state (core/cost.py `group_wait_wins`): a
    round later either way, so holding saves nothing. The question pays the wait, and so does
    each of its `late` followers, which come after the deadline and now wait for a later
    round end (the server cannot tell a question's branches from siblings that are requests
    of their own: each is charged); each other held question (`heads` - 1) pays the wait and
    a follower's work. Positive: holding wins."""
    if more <= 0 or wait_left <= 0:
        return 0.0
    own = _join(c, mean_extend if follower_extend is None else follower_extend)
    saved = max(c.alpha - max(size, 1.0) * own, 0.0)
    return (more * saved - wait_left * (1.0 + late)
            - (heads - 1) * (wait_left + more * _join(c, mean_extend)))


def _join(c: CostCoeffs, extend: float) -> float:
    """What one request of `extend` tokens adds to a round (work, row, attention pairs)."""
    return c.beta * extend + c.gamma + c.delta * extend * extend / 2


# NOTE: not measured; chosen as enough closed heads for `expect` to move in steps of ~3 % while
# it still follows a change of workload within a few dozen questions
FOLLOWERS_WINDOW = 32  # closed heads whose followers' arrivals `Followers.expect` reads


# NOTE: not measured; one pseudo-head whose followers came within the hold's deadline: the
# least that keeps a single late follower from ending the holds that teach when they come
TIMING_PRIOR = 1.0


@dataclass
class _Window:
    """One head's followers while they are counted (`Followers`)."""

    head: str  # the head's rid
    came: int  # the pass it registered in
    t0: float  # when it registered (rank-local clock)
    # each follower's arrival after t0, known to lie in (lo, hi]: after the scheduler last
    # looked at its queue, by the pass that registered it (a forward hides when in between)
    spans: list[tuple[float, float]] = field(default_factory=list)
    held: bool = False  # a hold kept it waiting


@dataclass(frozen=True)
class Expected:
    """What the followers of a held head are expected to do within its hold (`expect`)."""

    more: float = 0.0  # the chance at least one more comes before the hold's end
    joined: float = 0.0  # how many more come before it (those join the held round)
    late: float = 0.0  # how many come after it, during the round (holding delays each)


def _share(lo: float, hi: float, a: float, b: float) -> float:
    """The chance an arrival known to lie in (lo, hi], anywhere alike, lies in (a, b]."""
    if hi <= lo:
        return 1.0 if a < hi <= b else 0.0
    return max(0.0, min(hi, b) - max(lo, a)) / (hi - lo)


class Followers:
    """Requests that follow an arrival (its head), sharing its first tokens: a question's
    other branches, the other samples of an n > 1 request, a fork's siblings. A client sends
    them at once, but HTTP and the tokenizer pass them to the scheduler ~1-10 ms apart, so the
    head often finds an idle scheduler alone and its round runs before they register; the
    arrival rate (`hold_gain`) counts whole questions and cannot expect them.

    A head's followers are counted, each with when it came, until: the end of its own pass,
    where some came with it (the burst arrived together: closed unlearned, as that head is
    never asked); else the first pass after its round (what came while it waited or during
    that forward). `expect`: what the last `window` such heads' followers did in the time a
    hold has left. Learned from registrations, holds and selections on this rank's clock (the
    hold's outcome is agreed across ranks: adapter/admission.py)."""

    def __init__(self, window: int = FOLLOWERS_WINDOW) -> None:
        self._open: dict[Hashable, _Window] = {}  # queued heads, by burst key
        self._heads: dict[str, Hashable] = {}  # head rid -> its key, until selected
        # selected heads, by burst key: counted until the next pass (what comes during their
        # forward), while a request with their key that comes now heads a burst of its own
        self._running: dict[Hashable, _Window] = {}
        # each closed head's followers' arrival spans, and whether a hold watched it
        self._closed: deque[tuple[tuple, bool]] = deque(maxlen=window)
        self._pass = 0
        self._seen = 0.0  # when the scheduler last looked: what registers next came after

    def arrived(self, rid: str, key: Hashable, now: float) -> None:
        """A newly registered request: a follower of the queued head with its key, else a
        head; also a follower of the selected head with its key (it came during that forward:
        holding that head delayed it)."""
        for w in (self._running.get(key), self._open.get(key)):
            if w is not None:
                w.spans.append((max(self._seen - w.t0, 0.0), now - w.t0))
        if key not in self._open:
            self._open[key] = _Window(rid, self._pass, now)
            self._heads[rid] = key

    def held(self, key: Hashable) -> None:
        """A hold keeps the head with `key` waiting (its burst did not come together)."""
        w = self._open.get(key)
        if w is not None:
            w.held = True

    def selected(self, rid: str) -> None:
        """A round took `rid` (or it left the queue): a head's count goes on until the next
        pass (what comes during its forward)."""
        key = self._heads.pop(rid, None)
        if key is not None:
            older = self._running.get(key)
            if older is not None:  # NOTE: overlap: its round still runs; the new head's counts
                self._closed.append((tuple(older.spans), older.held))
            self._running[key] = self._open.pop(key)

    def passed(self, now: float, in_flight: Container[str] = ()) -> None:
        """A pass registered its arrivals: close the heads selected before it whose round is
        no longer `in_flight` (its result processed), and those whose burst came with them.
        NOTE: without overlap nothing is in flight at a pass, so a head closes at the first
        pass after its round; under overlap the loop passes while the forward runs, and
        what comes then still came during that forward. Only a head alone at its own pass is
        ever asked (a burst that came together is closed here, before the gate asks), so
        only such heads are learned from: siblings that arrive together after a lone first
        one completes must not make that lone one expect followers (issue 51: the sibling
        shape's p99)."""
        for key in [k for k, w in self._running.items() if w.head not in in_flight]:
            w = self._running.pop(key)
            self._closed.append((tuple(w.spans), w.held))
        together = [k for k, w in self._open.items()
                    if w.came == self._pass and w.spans and not w.held]
        for key in together:  # NOTE: closed unasked, unlearned
            self._heads.pop(self._open.pop(key).head, None)
        self._pass += 1
        self.watched(now)

    def watched(self, now: float) -> None:
        """The scheduler looked for arrivals at `now` (a pass, or the end of a hold's wait on
        its socket, which an arrival ends): what registers later came after it."""
        self._seen = now

    def running(self) -> int:
        """Selected heads whose followers are still counted (their round not processed)."""
        return len(self._running)

    def open(self) -> int:
        """Heads still queued whose followers are counted (0 once every request has left the
        queue). NOTE: a selected head's window holds no request and closes at the next pass;
        counting it made an idle kit whose last round ended its run read a stale record."""
        return len(self._open)

    def latest(self, key: Hashable) -> float | None:
        """When the open head with `key`'s burst last grew: its newest follower's registration,
        else its own (None: no open head has `key`)."""
        w = self._open.get(key)
        if w is None:
            return None
        return w.t0 + (w.spans[-1][1] if w.spans else 0.0)

    def expect(self, key: Hashable, now: float, wait_left: float,
               bound: float) -> Expected:
        """What the open, unselected head with `key` can expect in the `wait_left` seconds a
        hold has left, from the past heads with as many followers as it has so far: whether
        more came (`_more`), and of those a hold watched, when (`_timing`; `bound`: the hold's
        deadline D). Nothing for a head that is not open or has no past.

        When is counted from the burst's newest registration (the head's, then its last
        follower's), in the past heads from their registration with as many: a burst arrives
        in turn, each request a gap after the one before (a longer prompt passes the
        tokenizer later), so the gap after the last one is what a held burst waits for. From
        the head, the short prompts' bursts taught that a long prompt's last follower, later
        than theirs, comes after the hold had already ended (issue 51: paper mix at the paper
        profile, QuALITY's 3,000-token branches with RACE's 300)."""
        w = self._open.get(key)
        if w is None:
            return Expected()
        n = len(w.spans)
        if not any(len(spans) > n for spans, _ in self._closed):
            return Expected()  # NOTE: no past head had more (`_more` 0): nothing to slice
        past = [(spans[n:], held, spans[n - 1][1] if n else 0.0)
                for spans, held in self._closed if len(spans) >= n]
        more, size = _more([(nxt, held) for nxt, held, _ in past])
        age = now - self.latest(key)
        watched = [tuple((max(lo - ref, 0.0), hi - ref) for lo, hi in nxt)
                   for nxt, held, ref in past if held and nxt]
        first, joined, late = _timing(watched, age, age + wait_left, bound)
        return Expected(more * first, more * size * joined, more * size * late)


def _more(past: list[tuple[tuple, bool]]) -> tuple[float, float]:
    """The share of past heads that had more followers, and how many more those had."""
    counts = [len(nxt) for nxt, _ in past if nxt]
    return (len(counts) / len(past), sum(counts) / len(counts)) if counts else (0.0, 0.0)


def _timing(watched: list[tuple[tuple[float, float], ...]], a: float, b: float,
            bound: float) -> tuple[float, float, float]:
    """When the next followers of held heads came (a hold watches its head's queue, so they
    registered as they arrived; those after its end, during its forward, are known only to
    lie in that forward): the chance one came in (a, b], and the share of them that came in
    it and after it. A head never held says nothing of when; the estimate starts from
    `TIMING_PRIOR` heads whose followers came spread evenly over the hold's `bound`, so holds
    go on until held heads teach otherwise (one early hold whose only follower came late must
    not stop every later hold, and with it the learning)."""
    first = on_time = TIMING_PRIOR * _share(0.0, bound, a, b)
    after = TIMING_PRIOR * _share(0.0, bound, b, math.inf)
    for nxt in watched:
        none = 1.0
        for lo, hi in nxt:
            p = _share(lo, hi, a, b)
            none *= 1.0 - p
            on_time += p / len(nxt)
            after += _share(lo, hi, b, math.inf) / len(nxt)
        first += 1.0 - none
    k = len(watched) + TIMING_PRIOR
    return first / k, on_time / k, after / k


# NOTE: the paper's flexible-admission bound D (5 ms); the flex policies' default, a user flag
# (`--radixflow-admission-ms`, core/policy.py)
HOLD_MS = 5.0
# NOTE: not measured as a tuning (1.5, 2 and 3 gave the same paper-mix cell, issue 51): the bound
# that keeps a burst which never stops (its followers each within D of the one before) from
# holding its oldest request without end; a question's four branches span ~4-8 ms live
RENEWED = 2.0  # a cost-aware hold ends at most this many D after its oldest request came


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
        # NOTE: `wait_left`, the sum `wake_in` sleeps by: a hold that slept to its deadline
        # sees it reached (now - oldest fell a rounding short of it, and a virtual clock woke
        # no further)
        if self.wait_left(d.oldest_arrival, now, d.burst_last) <= 0 and enabled(Reason.DEADLINE):
            return Decision(False, Reason.DEADLINE)
        return Decision(True, Reason.HOLD)

    def _holding_loses(self, d: Demand, now: float) -> bool:
        """Neither an arrival at the recent rate (`hold_gain`) nor the rest of the oldest held
        request's burst (`burst_gain`) repays holding on."""
        wait_left = self.wait_left(d.oldest_arrival, now, d.burst_last)
        return (hold_gain(d.held, d.rate, d.mean_extend, d.cost, d.burst) <= 0
                and burst_gain(d.heads, d.followers, wait_left, d.mean_extend, d.cost,
                               d.follower_extend, d.burst_size, d.late_followers) <= 0)

    def wait_left(self, oldest: float, now: float, last: float | None = None) -> float:
        """Seconds from `now` to the deadline of a hold whose oldest request came at `oldest`
        (every rule that reads the deadline reads this one sum). Cost-aware, the deadline runs
        D from `last`, when the oldest one's burst last grew (`Demand.burst_last`), and ends
        at most `RENEWED` x D after `oldest`: a burst still arriving is held as one, as long as
        each of its requests comes within D of the one before (timers and the always-hold
        ablations keep the paper's D from the oldest)."""
        start = oldest
        if self.cost_aware and last is not None:
            start = min(max(oldest, last), oldest + (RENEWED - 1) * self.deadline_s)
        return start + self.deadline_s - now

    def wake_in(self, d: Demand, now: float) -> float:
        """Seconds until the deadline: the loop may sleep this long, never past it."""
        return max(0.0, self.wait_left(d.oldest_arrival, now, d.burst_last))


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
