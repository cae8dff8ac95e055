"""Where a selected request's boundary goes and how it publishes (issue 15; adapter/boundary.py).

The facts behind the two pure rules of core/boundary.py: `PlacementTargets` gives `place_rule`
its sources in order (declared, a learned marker, a repeat's length - 1, the forks of queued
sharers the round cannot take, a learned fork depth); `PublishFacts` gives `publish_rule` its
lazy tests (the lost tail's cost, a cut nobody uses, a learned cut that pays). Both read the
request and the scan's queue (adapter/boundary_scan.py) and decide nothing themselves.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixflow_sglang.core.boundary import (
    CONTINUATION,
    BoundaryLearner,
    Marker,
    MarkerLearner,
    place,
    place_rule,
    publish_at,
    publish_rule,
)
from radixflow_sglang.core.cost import CostCoeffs, cut_pays, cut_raises_tail, measured
from radixflow_sglang.core.grid import Grid, Layout
from radixflow_sglang.core.producers import as_tokens
from radixflow_sglang.core.reasons import Reason

from .reqs import budget_left, req_len, req_tokens

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import PrefillAdder

    from .boundary_scan import BoundaryScan
    from .reuse import ReuseBook

FIELD = "radixflow_boundary"


def declared_boundary(req: Req, native_branch: bool = False) -> int | None:
    """The request's declared boundary (tokens from the start), or None. A prefix warm-up's
    implicit one (`max_new_tokens` 0) yields to SGLang's own branching checkpoint
    (`native_branch`: the match carries the depth where this prompt leaves a cached one):
    extra_buffer tracks one state per extend, and moved to the warm-up's end it left every
    later prompt on the same system prompt to recompute it (n = 8 rollouts on a 1,000-token
    system prompt: 2.1x stock's prefill tokens; tests/test_engine.py)."""
    sp = req.sampling_params
    params = getattr(sp, "custom_params", None)
    if isinstance(params, dict):
        b = params.get(FIELD)
        if isinstance(b, int) and not isinstance(b, bool) and b > 0:
            return b
    if getattr(sp, "max_new_tokens", None) == 0 and not native_branch:
        # NOTE: a frontend fork's prefix / n>1 warm-up; its identical copies match at most
        # len - 1 tokens (SGLang keeps one token to compute), so the state must lie below len
        return len(req.origin_input_ids) - 1 or None
    return None


@dataclass
class RoundCosts:
    """The runtime's round-cost fit (`fit`, None: no cost gate) and, for the tail guard,
    (req, adder) -> seconds the oldest request finishing with this round arrived before it
    (the runtime's `_older_by`; None: no guard). Shared, so a setter on the publisher reaches
    every reader."""

    fit: Callable[[], CostCoeffs] | None = None
    older_by: Callable[[Req, PrefillAdder], float] | None = None


class PlacementTargets:
    """PLACE's sources for one request (core/boundary.py `place_rule`). `chosen`: depth ->
    marker of the last marker target (the book step reads it for a MARKER placement)."""

    def __init__(self, grid: Grid, declared: bool, learner: BoundaryLearner | None,
                 markers: MarkerLearner | None) -> None:
        self.grid = grid
        self.declared = declared
        self.learner = learner
        self.markers = markers
        self.chosen: dict[int, Marker] = {}

    def target(self, scan: BoundaryScan, req: Req, ns, prefix: int, extend: int,
               native_branch: bool, adder: PrefillAdder) -> tuple[Reason, int | None]:
        """Where this extend should publish: the PLACE rule that fired and its depth (core/
        boundary.py `place_rule`: declared, else learned: a marker first, since it finds this
        request's own document end, where a depth learned from other paths is only right when
        their documents are as long)."""
        b = declared_boundary(req, native_branch) if self.declared else None
        native = (self.grid.planned_depth(prefix, extend, None)
                  if self.learner is not None and not native_branch else None)

        def learned() -> int | None:
            guess = self.learner.predict(ns, prefix, native)
            d = None if guess is None else publish_at(self.grid, guess, prefix, extend)
            return d if d is not None and not scan.queued_past(req, ns, d) else None

        return place_rule(
            None if b is None else lambda: publish_at(self.grid, b, prefix, extend),
            self.learner is not None, native_branch,
            lambda: self.marker(scan, req, ns, prefix, extend, native),
            lambda: self.repeat(req, ns, prefix, extend, native),
            lambda: self.queued(scan, req, ns, prefix, extend, native, adder), learned)

    def repeat(self, req: Req, ns, prefix: int, extend: int, native: int | None) -> int | None:
        """Identical copies of this prompt are expected (the namespace repeats prompts): the
        deepest depth they can match, length - 1 (its grid floor), instead of the prompt's end
        (core/boundary.py `BoundaryLearner.repeat_wins`). no_buffer cuts there (the rest, one
        token, publishes the end next round); extra_buffer moves its one tracked state."""
        n = len(req_tokens(req))
        if prefix + extend != n:
            return None  # NOTE: a chunk that does not reach the end: nothing to move
        d = publish_at(self.grid, n - 1, prefix, extend)
        if d is None or not self.learner.repeat_wins(ns, prefix, native, d):
            return None
        return d

    def queued(self, scan: BoundaryScan, req: Req, ns, prefix: int, extend: int,
               native: int | None, adder: PrefillAdder) -> int | None:
        """The depth where the one state serves most (core/boundary.py `place`) among the
        forks of the queued requests this round cannot take that share this extend past its
        ready prefix (known demand, 1 each) and the continuations of its end (the namespace's
        share); None: its end serves most, or no such request. The scan's traversal moves a
        producer to the fork of each consumer it visits (`_apply_fork`); this serves those a
        full budget leaves unvisited (a burst: the budget fills with each group's first
        requests before their siblings are reached)."""
        if native is None or (self.grid.layout is Layout.NO_BUFFER and self.has_mark(
                scan, req, ns, prefix, extend, native)):
            return None
        tokens = req_tokens(req)
        left, siblings = budget_left(adder), 0
        points = []
        mine = as_tokens(tokens)
        for r in scan.sharers(req, tokens, ns):
            need = req_len(r) - r.prefix_len
            # NOTE: the round may reach and take it (the traversal's case): the demand queued
            # between them fits, less the other sharers between (Blocked by `req`, they park)
            reach = scan.between(req, r)
            if reach is not None:
                reachable = reach - siblings <= left
                siblings += need
                if reachable:
                    continue
            overlap = scan.overlap(r, mine)  # NOTE: a token compare: a reachable one needs none
            if overlap <= max(prefix, r.prefix_len):
                continue  # NOTE: its own ready prefix reaches the fork: no state needed
            d = publish_at(self.grid, overlap, prefix, extend)
            points.append((native if d is None else d, 1.0))
        if not points:
            return None
        points.append((native, self.continuations(ns)))
        return place(prefix, native, points)

    def has_mark(self, scan: BoundaryScan, req: Req, ns, prefix: int, extend: int,
                 native: int) -> bool:
        """no_buffer: a learned marker or piece lies in the extend, so a request that cuts
        nothing at admission gets it as its mark (`fork_mark`): the traversal's fork cut at
        it serves the document's later questions too; a cut at the siblings' fork, made now,
        would not (docs/notes/2026-12-queued-forks.md: the paper mix, 4 %)."""
        return self.markers is not None and self.marker(
            scan, req, ns, prefix, extend, native, pieces=True) is not None

    def marker(self, scan: BoundaryScan, req: Req, ns, prefix: int, extend: int,
               native: int | None, pieces: bool | None = None) -> int | None:
        """A depth right after a learned marker, where the one state serves more requests than
        where it would go (core/boundary.py `place`), or None. `pieces`: template pieces are
        candidates too (default: extra_buffer only)."""
        if native is None:
            return None
        tokens = req_tokens(req)
        # NOTE: template pieces are guesses: extra_buffer moves its one state for free, a
        # no_buffer cut costs the request a round (docs/design.md, "A guess never costs a round")
        if pieces is None:
            pieces = self.grid.layout is Layout.EXTRA_BUFFER
        cands = self.markers.candidates(tokens, prefix, prefix + extend, pieces=pieces,
                                        key=(req.rid, len(tokens)))
        if not cands:
            return None
        points = []
        self.chosen = {}
        for pos, m in cands:
            d = publish_at(self.grid, pos, prefix, extend)
            if d is not None:
                points.append((d, m.usage.rate))
                self.chosen.setdefault(d, m)
        if not points:
            return None
        low = min(d for d, _ in points)
        for common in scan.sibling_depths(req, tokens, ns, low):
            d = publish_at(self.grid, common, prefix, extend)
            points.append((native if d is None else d, 1.0))
        points.append((native, self.continuations(ns)))
        return place(prefix, native, points)

    def fork_mark(self, scan: BoundaryScan, req: Req, ns, prefix: int, extend: int,
                  native_branch: bool) -> tuple[int, Marker] | None:
        """no_buffer, nothing published: (the marker depth, template pieces included, where a
        fork cut would serve more than at the fork, its marker), or None (docs/design.md, "A
        cut the traversal makes anyway")."""
        if (self.grid.layout is not Layout.NO_BUFFER or self.markers is None or native_branch
                or (self.declared and declared_boundary(req, native_branch) is not None)):
            return None
        native = self.grid.planned_depth(prefix, extend, None)
        d = self.marker(scan, req, ns, prefix, extend, native, pieces=True)
        return (d, self.chosen[d]) if d is not None and d in self.chosen else None

    def continuations(self, ns) -> float:
        """The share of this namespace's reuse events that continued an end state."""
        ev = self.learner.events(ns)
        return sum(1 for _, k in ev if k == CONTINUATION) / len(ev) if ev else 0.0


class PublishFacts:
    """PUBLISH's lazy tests for a placed depth (core/boundary.py `publish_rule`); `costs.fit`:
    the runtime's round-cost fit."""

    def __init__(self, grid: Grid, costs: RoundCosts, book: ReuseBook) -> None:
        self.grid = grid
        self.costs = costs
        self.book = book

    def rule(self, scan: BoundaryScan, req: Req, tokens, ns, depth: int | None,
             adder: PrefillAdder, cut_ok: bool, source: Reason) -> Reason:
        """The PUBLISH rule that fires for `depth` (placed by PLACE rule `source`)."""
        can_cut = cut_ok and adder.new_chunked_req in (None, req)
        return publish_rule(
            depth, self.grid.layout, can_cut, source != Reason.DECLARED,
            lambda: self.pays(scan, req, tokens, ns, depth, scan.keys.of(req, tokens, ns, depth),
                              adder, source))

    def pays(self, scan: BoundaryScan, req: Req, tokens, ns, depth: int, key: tuple,
             adder: PrefillAdder, source: Reason) -> bool:
        """A learned boundary (PLACE rule `source`): the cut's state saves more than the round
        the cut adds to `req` (core/cost.py `cut_pays`; behind it: the unselected queue; its
        future users: the placements of `source` a later request used, `ReuseBook.placed`)."""
        c = self.costs.fit() if self.costs.fit is not None else None
        if c is None or not measured(c):
            return True  # NOTE: the prior's alpha is an assumption: gate on measured rounds
        picked = {r.rid for r in adder.can_run_list}
        rest = [r for r in scan.queue if r.rid not in picked and r is not req]
        left = budget_left(adder)
        # NOTE: queued input lengths: an upper bound of the demand, as the wait rule's
        backlog = sum(req_len(r) for r in rest) > left
        budget = int(left + adder.log_input_tokens) if backlog else 0
        users = self.book.users(scan, req, tokens, ns, depth, key, adder, source)
        older_by = self.costs.older_by
        if (not backlog and older_by is not None
                and cut_raises_tail(c, len(tokens) - depth, older_by(req, adder))):
            return False
        return cut_pays(c, depth - req.prefix_len, len(tokens) - depth, len(rest), users,
                        budget)
