"""State-ready traversal (the paper's Algorithm 1), engine-free.

Each round the adapter visits waiting requests in native order. For each it asks `classify`:
Blocked when a live producer in the same cache namespace will publish a state that gives the
request a ready prefix at least `theta` tokens longer than it has now, at a depth it can match
(<= input length - 1). Blocked requests are parked (wait set) and rechecked next round;
everything else keeps native handling. When the producer's own publish depth lies past the
fork point, the producer is moved to publish at the grid-aligned fork depth instead.

With `cost_aware` (the `radixflow` and `traversal` policies) a Blocked request parks only when
waiting adds less summed latency than recomputing its gain now (`decide`, core/cost.py
`wait_wins`, derivation in docs/design.md); the `-always` ablations park on every Blocked.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from .cost import (
    CostCoeffs,
    RoundView,
    Verdict,
    WaitCase,
    group_wait_wins,
    recomputes_at_every_ready,
)
from .grid import Grid, Layout
from .outcome import Blocking
from .points import wait
from .producers import CHAIN_BLOCK, Producer, ProducerIndex, TokenChains
from .reasons import Reason
from .stats import RoundStats
from .waitset import WaitSet

# NOTE: theta's floor (theta = max(G, 64) unless `--radixflow-theta`): full attention publishes
# every page (G = 1), so it still waits only for a gain of one GDN chunk (FLA's 64); not measured
THETA_FLOOR = 64
# NOTE: not measured; chosen as one round of slack past the publish lag (a state a round late
# is still waited for, and no park outlives lag + 1 rounds): `--radixflow-park-margin`
PARK_MARGIN = 1


@dataclass(frozen=True)
class TraversalConfig:
    grid: Grid
    theta: int  # minimum gain in ready tokens worth a wait
    max_park_rounds: int  # publish lag (1 normal, 2 overlap) plus a margin
    lag: int = 1  # rounds until a producer admitted in this scan publishes (2 under overlap)
    cost_aware: bool = False  # park only when waiting wins (`decide`); else on every Blocked

    @staticmethod
    def default(grid: Grid, overlap: bool, margin: int = PARK_MARGIN, theta: int | None = None,
                cost_aware: bool = False):
        lag = 2 if overlap else 1
        return TraversalConfig(grid, theta or max(grid.size, THETA_FLOOR), lag + margin, lag,
                               cost_aware)


@dataclass(frozen=True)
class Candidate:
    rid: str
    namespace: Hashable
    tokens: Sequence[int]
    ready: int  # ready prefix under the current cache
    max_prefix: int  # matchable length: input length - 1


@dataclass
class TraversalRound:
    """What the traversal knows for one round (one scan with its hooks on): `begin_round`
    builds a fresh one, so nothing of it is reset by hand. The adapter's scan owns it
    (adapter/scanstate.py `Scan.walk`); the traversal keeps the last one for `forget` and
    for the next round's `committed`."""

    index: ProducerIndex  # the live producers: in flight, then admitted this round
    stats: RoundStats
    fork_slots: int = 0  # producers that may still be moved this round (no_buffer: 1)
    inflight: set[str] = field(default_factory=set)  # producers launched in an earlier round
    # NOTE: rid -> producer of a wait decided over a publish lag of 2 (overlap): decided
    # last round / this round. The next visit keeps it (its cost was counted whole).
    committed: dict[str, str] = field(default_factory=dict)
    committing: dict[str, str] = field(default_factory=dict)
    # NOTE: (namespace, ready, group depth, hash of the prefix to it) -> this round's verdict
    # for that sibling group (not keyed by producer: a sibling that recomputed becomes a
    # producer of the same depth for the next one)
    groups: dict[tuple, Verdict] = field(default_factory=dict)
    last_group: tuple | None = None  # ((rid, Blocking), key): `Traversal._group`'s last answer
    # NOTE: sibling groups (key less the ready prefix) this round waited for / recomputed
    # without a probe (`recomputes_unprobed`): a later sibling follows either
    group_waits: set[tuple] = field(default_factory=set)
    unprobed: set[tuple] = field(default_factory=set)
    marked: dict[tuple, Blocking] = field(default_factory=dict)  # group -> its mark's Blocking


class Traversal:
    def __init__(self, cfg: TraversalConfig) -> None:
        self.cfg = cfg
        block = min(CHAIN_BLOCK, cfg.theta)
        self.chains = TokenChains(block)  # NOTE: a request's hash chain, kept across rounds
        self.waits = WaitSet(cfg.max_park_rounds)
        self.round = 0
        self.now = TraversalRound(ProducerIndex(block, self.chains), RoundStats(0))

    # NOTE: the current round's, read by the adapter and the tests
    @property
    def index(self) -> ProducerIndex:
        return self.now.index

    @property
    def stats(self) -> RoundStats:
        return self.now.stats

    @property
    def fork_slots(self) -> int:
        return self.now.fork_slots

    # --- round lifecycle -------------------------------------------------------------------
    def begin_round(self, inflight: Iterable[Producer], fork_slots: int) -> TraversalRound:
        """Start a scan: producers are only the in-flight ones (results not processed yet);
        a wait committed last round is kept this one."""
        self.round += 1
        self.chains.tick()
        now = TraversalRound(ProducerIndex(self.now.index.block, self.chains),
                             RoundStats(self.round), fork_slots,
                             committed=self.now.committing)
        for p in inflight:
            p.movable = False
            now.index.add(p)
            now.inflight.add(p.rid)
        self.now = now
        return now

    def end_round(self, selected: Iterable[str]) -> RoundStats:
        for rid in selected:
            self.waits.release(rid)
        self.now.stats.wait_set = len(self.waits)
        return self.now.stats

    # --- per request -----------------------------------------------------------------------
    def quiet(self) -> bool:
        """Nothing can be Blocked now, O(1): no producer is indexed (none in flight, none
        admitted yet this scan), so every visit gets native handling without a lookup."""
        return len(self.index) == 0

    def may_block(self, rid: str, namespace: Hashable, tokens: Sequence[int]
                  ) -> list[tuple[Producer, int]]:
        """Cheap pre-check (no cache match): the live producers sharing >= a block with the
        request (empty: none, it cannot be Blocked); pass them on to `classify`. The request's
        hash chain is cached across rounds (a waiting request's tokens do not change)."""
        if len(self.index) == 0:
            return []
        chain = self.index.chain(rid, namespace, tokens)
        return self.index.sharers(namespace, tokens, exclude=rid, chain=chain)

    def classify(self, c: Candidate, hits: list[tuple[Producer, int]] | None = None
                 ) -> Blocking | None:
        """Blocked(c) per the module docstring; None means native handling. No side effects.
        `hits`: `may_block`'s answer for c in this state of the index (else looked up again).
        NOTE: any sharing producer may block c, not only the longest: an in-flight sharer
        that publishes past c's reach must not hide one that publishes within it."""
        if hits is None:
            hits = self.index.sharers(c.namespace, c.tokens, exclude=c.rid,
                                      chain=self.index.chain(c.rid, c.namespace, c.tokens))
        for p, common in hits:
            b = self._blocking(c, p, common)
            if b is not None:
                return b
        return None

    def _blocking(self, c: Candidate, p: Producer, common: int) -> Blocking | None:
        reach = min(common, c.max_prefix)
        g = self.cfg.grid
        mark = None
        if g.layout is Layout.FULL:
            depth, fork = (g.fork_depth(p.prefix, p.extend, reach) or 0), False
        elif p.publish is not None and p.publish <= reach:
            depth, fork = p.publish, False
        elif p.movable and (p.forked or self.now.fork_slots > 0):
            depth, fork = g.fork_depth(p.prefix, p.extend, reach), True
            if depth is None or (g.layout is Layout.EXTRA_BUFFER and depth - p.prefix < g.size):
                return None
            if p.mark is not None and p.prefix < p.mark < depth and \
                    p.mark - c.ready >= self.cfg.theta:
                # NOTE: the cut serves later questions too (Producer.mark); a mark within theta
                # of the ready prefix would turn a waiting consumer into a recompute. The
                # cost-aware rule takes it only where waiting for it still wins (`decide`).
                if self.cfg.cost_aware:
                    mark = p.mark
                else:
                    depth = p.mark
        else:
            return None
        if depth - c.ready < self.cfg.theta:
            return None
        return Blocking(p.rid, depth, c.ready, fork, mark)

    def group_depth(self, b: Blocking) -> int:
        """The prefix a sibling group shares: the depth floored to a 64-token block. NOTE:
        siblings' forks differ by a few tokens where their texts differ by a token or two (a
        no_buffer fork is the exact common prefix: 343 vs 341 traced on RACE options)."""
        q = self.index.block
        return max(b.depth // q * q, b.ready)

    def _group(self, c: Candidate, b: Blocking) -> tuple:
        # NOTE: asked twice per candidate (the runtime's sibling count, then `decide`): the
        # prefix is hashed once (a request's tokens do not change within a scan)
        last = self.now.last_group
        if last is not None and last[0] == (c.rid, b):
            return last[1]
        d = self.group_depth(b)
        # NOTE: the prefix's hash is its cached chain's key at d (d is a whole number of blocks
        # when it is past the ready prefix, as Blocked needs: gain >= theta >= block)
        if d % self.index.block == 0 and d > 0:
            h = self.index.chain(c.rid, c.namespace, c.tokens).key(d)
        else:
            h = hash(tuple(c.tokens[:d]))
        key = (c.namespace, b.ready, d, h)
        self.now.last_group = ((c.rid, b), key)
        return key

    def group_verdict(self, c: Candidate, b: Blocking) -> Verdict | None:
        """The verdict this scan already gave a sibling of `c` (same namespace and ready prefix,
        the same tokens to the group depth), None for the group's first candidate (it needs
        `RoundView.siblings`)."""
        return self.now.groups.get(self._group(c, b))

    def decide(self, c: Candidate, b: Blocking, view: RoundView, cost: CostCoeffs) -> Verdict:
        """Cost-aware rule: does waiting for `b` add less summed latency than recomputing?
        core/points.py `wait` over `WaitFacts` (the rules, in order); the verdict names the
        rule that decided (`Verdict.reason`). Always True without `cost_aware`."""
        if not self.cfg.cost_aware:
            return Verdict(True, 0.0, 0.0, reason=Reason.ALWAYS_WAIT)
        f = WaitFacts(self, c, b, lambda: view, cost)
        return f.outcome(wait(f)[1])

    def _group_verdict(self, c: Candidate, b: Blocking, key: tuple, lag: int,
                       view: Callable[[], RoundView], cost: CostCoeffs) -> Verdict:
        """The verdict of `c`'s sibling group this scan: the first sibling's cost comparison
        (`group_wait_wins`, `view()` asked only then), which the rest follow. An in-flight
        producer publishes after this round (lag 1); one admitted in this scan after `cfg.lag`
        rounds."""
        now = self.now
        v = now.groups.get(key)
        if v is not None:
            return v
        rv = view()
        v = now.groups[key] = group_wait_wins(cost, self._case(c, b, lag), rv)
        if v.wait and b.mark is not None:
            # NOTE: the fork's verdict decides; the cut moves to the mark only where the
            # group still waits for it (a smaller gain, a longer rest: a marginal wait at
            # the fork recomputes at the mark, and its question then runs cold whole)
            m = Blocking(b.producer, b.mark, b.ready, b.fork)
            vm = group_wait_wins(cost, self._case(c, m, lag), rv)
            if vm.wait:
                at = self._group(c, m)
                now.groups[at] = vm
                now.group_waits.add(_unready(at))
                now.marked[key] = m
                v = vm
        return v

    def placed(self, c: Candidate, b: Blocking) -> Blocking:
        """The Blocking a waiting `c` parks with: at the mark where its group's verdict took it
        (`decide`), else at the fork."""
        if b.mark is None:
            return b
        return self.now.marked.get(self._group(c, b),
                                   Blocking(b.producer, b.depth, b.ready, b.fork))

    def _case(self, c: Candidate, b: Blocking, lag: int) -> WaitCase:
        p = self.index.get(b.producer)
        cut_rest = 0
        if b.fork and self.cfg.grid.layout is Layout.NO_BUFFER and p is not None:
            # the producer's extend would end at the fork: its rest waits a round
            cut_rest = max(p.prefix + p.extend - b.depth, 0) if not p.forked else 0
        return WaitCase(c.ready, b.depth, len(c.tokens), lag, cut_rest)

    def blockings(self, c: Candidate, hits: list[tuple[Producer, int]]) -> list[Blocking]:
        """Every Blocking `classify` could return for `c` at a ready prefix >= `c.ready`: the
        depth a sharer publishes at does not depend on the ready prefix, only the theta check
        does, and it is weakest at the smallest ready prefix."""
        return [b for p, n in hits if (b := self._blocking(c, p, n)) is not None]

    def recomputes_unprobed(self, c: Candidate, blockings: list[Blocking],
                            view: Callable[[Blocking], RoundView], cost: CostCoeffs) -> bool:
        """True when `decide` recomputes `c` whatever its ready prefix turns out to be, so the
        probe match can be skipped (docs/design.md, "Skipping the probe"). `c.ready` is the
        smallest ready prefix possible (0: nothing matched yet), `blockings` `blockings(c)`,
        `view(b)` the RoundView `decide` would be given with `b`. Never with the always-wait
        rule, a wait kept across rounds or a sibling group that already waits in this scan.
        On True its groups are recorded: a later sibling that is probed follows them (as it
        follows a probed sibling's verdict)."""
        if not (self.cfg.cost_aware and blockings):
            return False
        groups, now = [], self.now
        for b in blockings:
            if now.committed.get(c.rid) == b.producer and b.producer in now.inflight:
                return False
            g = _unready(self._group(c, b))
            if g in now.group_waits:
                return False
            groups.append(g)
            if g in now.unprobed:
                continue
            lag = 1 if b.producer in now.inflight else self.cfg.lag
            if not recomputes_at_every_ready(cost, self._case(c, b, lag), view(b)):
                return False
        now.unprobed.update(groups)
        return True

    def park(self, c: Candidate, b: Blocking) -> None:
        """Park a Blocked request (core/points.py `visit` checked its bound)."""
        p = self.index.get(b.producer)
        assert p is not None
        if b.fork and (p.publish is None or b.depth < p.publish):
            if not p.forked:
                self.now.fork_slots -= 1
                p.forked = True
                self.now.stats.forks += 1
            p.publish = b.depth
        p.consumers.append(c.rid)
        self.waits.park(c.rid, self.round, b.producer, b.depth)
        self.now.stats.blocked += 1

    def admitted(self, p: Producer) -> None:
        """A request the native admission selected becomes a producer for later candidates."""
        self.waits.release(p.rid)
        self.now.index.add(p)

    def forget(self, rid: str) -> None:
        self.waits.forget(rid)
        self.now.committed.pop(rid, None)
        self.now.committing.pop(rid, None)
        self.now.index.remove(rid)
        self.chains.forget(rid)


class WaitFacts:
    """core/points.py `wait`'s facts for a probed Blocked candidate `c` of this scan, each read
    only when a rule reaches it. Siblings (Blocked from the same ready prefix, sharing the
    tokens to the group depth) get one verdict per scan: the first's comparison
    (`group_wait_wins` over `view()`, its `RoundView.siblings`), which the rest follow; a split
    makes their question wait for both. A wait decided over 2 rounds (overlap) is kept on its
    second visit to the same producer: its cost was counted whole. Reading `verdict` records
    the group's verdict, as deciding it does."""

    def __init__(self, t: Traversal, c: Candidate, b: Blocking, view: Callable[[], RoundView],
                 cost: CostCoeffs) -> None:
        self.t, self.c, self.b, self.view, self.cost = t, c, b, view, cost
        self.lag = 1 if b.producer in t.now.inflight else t.cfg.lag
        self._verdict: Verdict | None = None

    @property
    def committed(self) -> bool:
        now = self.t.now
        return now.committed.get(self.c.rid) == self.b.producer and self.b.producer in now.inflight

    @property
    def bound_would_cut(self) -> bool:
        # NOTE: it would park, then recompute the same gain rounds later (a chain of waits
        # under overlap). A spent bound (0 left) is VISIT's `bound_spent`.
        return 0 < self.t.waits.rounds_left(self.c.rid) < self.lag

    @property
    def verdict(self) -> Verdict:
        if self._verdict is None:
            t, key = self.t, self.t._group(self.c, self.b)
            v = self._verdict = t._group_verdict(self.c, self.b, key, self.lag, self.view,
                                                 self.cost)
            if v.wait:
                t.now.group_waits.add(_unready(key))
                if self.lag > 1:
                    t.now.committing[self.c.rid] = self.b.producer
        return self._verdict

    def outcome(self, why: Reason) -> Verdict:
        """The verdict `why` gave (the trace's `decide` event; `Traversal.decide`). A spent
        bound vetoed a park: a committed wait's, or the group verdict's when it was read."""
        if why is Reason.BOUND_SPENT:
            why = Reason.COMMITTED_WAIT if self._verdict is None else Reason.WAIT_WINS
        if why in (Reason.COMMITTED_WAIT, Reason.BOUND_WOULD_CUT):
            return Verdict(why is Reason.COMMITTED_WAIT, 0.0, 0.0, reason=why)
        return self.verdict


def _unready(key: tuple) -> tuple:
    """A sibling group's key without the ready prefix (`Traversal._group`)."""
    return (key[0], *key[2:])
