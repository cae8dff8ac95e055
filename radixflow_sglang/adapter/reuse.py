"""What boundary states were published and who reused them (issue 15; adapter/boundary.py).

`ReuseBook` keeps, across scans, the evidence a boundary decision reads: the boundary states
published (`done`, their reuse rate `usage`), the learned placements and how often a later
request used one (`placed`, per learned PLACE source: a learned cut's expected users, with
evidence after declining), the states published after a learned marker (its own rate), and
what each selected request publishes (the learner's records, for classifying later hits).
`users` turns that evidence and the scan's queue into a state's expected users.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from radixflow_sglang.core.boundary import (
    PUBLICATION_KEYS,
    BoundaryLearner,
    Marker,
    UsageRate,
    consumers,
)
from radixflow_sglang.core.grid import Grid
from radixflow_sglang.core.reasons import Reason

from .boundary_scan import prefix_key
from .reqs import req_tokens

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import PrefillAdder

    from .boundary_scan import BoundaryScan, PrefixKeys

LEARNED_SOURCES = (Reason.MARKER, Reason.REPEAT, Reason.LEARNED)


@dataclass(frozen=True)
class Placed:
    """A learned boundary placed on a request: who placed it, its own publish depth and that
    prefix's key (a later request sharing it is a continuation), the siblings queued then."""

    rid: str
    end: int | None
    end_key: tuple | None
    sibs: frozenset[str]


def _bounded(d: dict) -> None:
    """Drop `d`'s oldest entry past PUBLICATION_KEYS (insertion order)."""
    if len(d) > PUBLICATION_KEYS:
        d.pop(next(iter(d)))


class ReuseBook:
    """Boundary publications, learned placements and their reuse, across scans."""

    def __init__(self, grid: Grid, learner: BoundaryLearner | None) -> None:
        self.grid = grid
        self.learner = learner
        self.moved = {"declared": 0, "learned": 0, "marker": 0, "repeat": 0, "queued_fork": 0,
                      "fork_mark": 0}
        self.usage = UsageRate()  # how often a boundary state was reused (future users)
        # NOTE: per learned PLACE source, how often a later request shared a placed prefix to
        # its depth but not to the placing request's own end (what only that state serves),
        # published or not: a learned cut's expected users, with evidence after declining
        self.placed = {r: UsageRate() for r in LEARNED_SOURCES}
        self.placements: dict[tuple, Placed] = {}  # key (ns, depth, prefix hash) -> record
        # NOTE: key -> (marker, siblings queued then) of a state published after a marker
        self.marked: dict[tuple, tuple[Marker, frozenset[str]]] = {}
        self.done: dict[tuple, None] = {}  # keys published at a boundary (bounded, ordered)

    # --- learn: a selected request's match ----------------------------------------------------
    def observe(self, tokens, ns, prefix: int, branching: int | None) -> None:
        """The learner's event for this match (a repeat, a fork, a continuation)."""
        key = prefix_key(ns, tokens, prefix) if prefix > 0 else None
        self.learner.observe(ns, prefix, key, branching,
                             self._is_repeat(tokens, ns, prefix, key))

    def _is_repeat(self, tokens, ns, prefix: int, key: tuple | None) -> bool:
        """Was this request's whole matchable prompt (length - 1) cached already? Its ready
        prefix reaches it, it resumes from a state placed for repeats, or an earlier request
        of the same tokens published its state at this exact length (which no identical copy
        can match: the live nsample burst's first copy, alone in its round)."""
        n = len(tokens)
        if key is not None and (prefix >= n - 1 or self.learner.kind(key) == "repeat"):
            return True
        return (self.learner.publishes_at(n)
                and self.learner.kind(prefix_key(ns, tokens, n)) is not None)

    def hits(self, keys: PrefixKeys, req: Req, tokens, ns, prefix: int,
             markers: bool) -> None:
        """The states this match resumes from: a boundary state, one published after a
        learned marker (`markers`: markers are learned), a learned placement."""
        if prefix > 0 and self.usage.watching(prefix):
            self.usage.hit(prefix_key(ns, tokens, prefix))
        if prefix > 0 and markers:
            hit = self.marked.get(prefix_key(ns, tokens, prefix)) if self.marked else None
            if hit is not None and req.rid not in hit[1]:
                hit[0].usage.hit(prefix_key(ns, tokens, prefix))
        if self.placements:
            self._placement_hits(keys, req, tokens, ns, prefix)

    def _placement_hits(self, keys: PrefixKeys, req: Req, tokens, ns, prefix: int) -> None:
        """`req` uses each open placement whose prefix it shares (its ready prefix not past
        it: no deeper state served it) but not to the placing request's own publish depth
        (there SGLang's own state serves it without any boundary)."""
        n = len(tokens)
        for rate in self.placed.values():
            for d in rate.open_depths():
                if not prefix <= d < n:
                    continue
                key = keys.of(req, tokens, ns, d)
                p = self.placements.get(key)
                if p is None or p.rid == req.rid or req.rid in p.sibs:
                    continue
                if p.end_key is not None and p.end < n and \
                        keys.of(req, tokens, ns, p.end) == p.end_key:
                    continue  # NOTE: a continuation of its end: served natively
                rate.hit(key)

    # --- decide: a state's expected users ---------------------------------------------------
    def users(self, scan: BoundaryScan, req: Req, tokens, ns, depth: int, key: tuple,
              adder: PrefillAdder, source: Reason | None = None) -> float:
        """Requests expected to reuse a state at `depth` (core/boundary.py `consumers`): its
        queued siblings, and future ones at the reuse share of `source`'s placements (a
        learned PLACE rule; repeats: at most the namespace's repeat share) or of boundary
        states (`usage`)."""
        # NOTE: itself and its siblings selected this scan excluded (they run now)
        queued = scan.groups_at(depth).get(key, 0) - 1
        queued -= sum(1 for r in adder.can_run_list
                      if r is not req and scan.keys.get(r.rid, depth) == key)
        # NOTE: SGLang's branching depth is the KV hit floored to the grid
        b = req.mamba_branching_seqlen
        rate = self.placed[source].exposed_rate if source in self.placed else self.usage.rate
        if source == Reason.REPEAT and self.learner is not None:
            # NOTE: the measured rate starts at its prior (1) and falls with unused placements;
            # the namespace's repeat share bounds it from the first placement (a retry now and
            # then: every distinct prompt cut at length - 1 until the rate fell)
            rate = min(rate, self.learner.repeat_share(ns))
        return consumers(max(queued, 0), b is not None and b >= depth // self.grid.size
                         * self.grid.size, rate)

    # --- book: what a selected request places and publishes ------------------------------------
    def place(self, scan: BoundaryScan, req: Req, tokens, ns, depth: int, source: Reason,
              end: int | None) -> None:
        """Watch a learned boundary placed on `req` at `depth` (its own publish depth `end`),
        whatever PUBLISH then does: a later request that shares its prefix to `depth` (not a
        sibling queued now: `users` counts those) uses it (`hits`)."""
        key = scan.keys.of(req, tokens, ns, depth)
        if key in self.placements:
            return  # NOTE: the prefix was placed before: one placement, one outcome
        scan.groups_at(depth)  # NOTE: keys every queued request at this depth
        sibs = frozenset(r.rid for r in scan.queue if r is not req
                         and scan.keys.get(r.rid, depth) == key)
        end_key = (scan.keys.of(req, tokens, ns, end)
                   if end is not None and depth < end <= len(tokens) else None)
        self.placements[key] = Placed(req.rid, end, end_key, sibs)
        self.placed[source].published(key, depth)
        _bounded(self.placements)

    def published(self, scan: BoundaryScan, req: Req, tokens, ns, depth: int, source: str,
                  marker: Marker | None) -> None:
        """Book a state `req` publishes at `depth` (`source` counts it in `moved`; a `marker`
        watches its reuse)."""
        self.moved[source] += 1
        key = scan.keys.of(req, tokens, ns, depth)
        if marker is not None:
            self._mark(scan, req, tokens, depth, key, marker)
        scan.serving.add(key)
        self.done[key] = None
        self.usage.published(key, depth)
        _bounded(self.done)

    def _mark(self, scan: BoundaryScan, req: Req, tokens, depth: int, key: tuple,
              marker: Marker) -> None:
        """Watch a state published after `marker`: used when a later request (not a sibling
        queued now) resumes from it."""
        sibs = frozenset(r.rid for r in scan.queue if r is not req
                         and req_tokens(r)[:depth] == tokens[:depth])
        marker.usage.published(key, depth)
        self.marked[key] = (marker, sibs)
        _bounded(self.marked)

    def record(self, cut: Req | None, req: Req, tokens, ns, moved: int | None,
               native_branch: bool, source: str | None = None) -> None:
        """What this extend publishes, for classifying later hits (core/boundary.py); `cut`:
        the request cut at its boundary this scan."""
        if moved is not None:
            kind = "repeat" if source == "repeat" else "boundary"
            self.learner.published(prefix_key(ns, tokens, moved), kind, moved)
            if cut is not req:
                return  # NOTE: the moved state replaces the end state
            # NOTE: cut: the rest runs next round as a chunk and publishes the end
            q, kind = self.grid.planned_depth(moved, len(tokens) - moved), "end"
        else:
            if req.extend_end < len(tokens):
                return  # NOTE: a middle chunk: neither a fork nor a request's end
            q = self.grid.planned_depth(req.prefix_len, req.extend_end - req.prefix_len,
                                        req.mamba_branching_seqlen)
            kind = "branch" if native_branch else "end"
        if q is not None:
            self.learner.published(prefix_key(ns, tokens, q), kind, q)
