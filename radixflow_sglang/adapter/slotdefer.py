"""no_buffer: a request deferred for SGLang's one chunk slot (issue 15; docs/design.md, "The
chunk slot").

A boundary cut ends an extend as SGLang's one chunked request; while another cut holds the slot,
`SlotDeferral.defer` skips a request whose own cut would pay for the wait (core/boundary.py
`defer_wins`), capped per request. `still_deferred` repeats a recent scan's verdict before
SGLang's match while nothing it read has changed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING

from radixflow_sglang.core.boundary import defer_wins
from radixflow_sglang.core.grid import Grid, Layout

from .reqs import namespace, req_tokens

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import PrefillAdder

    from .boundary_scan import BoundaryScan
    from .placement import PlacementTargets, RoundCosts
    from .reuse import ReuseBook

# NOTE: rounds a request may be deferred for the chunk slot: a bound on its latency (rule
# `boundary_slot`); not measured
MAX_DEFER = 16
# NOTE: scans a slot deferral is remembered without SGLang's match (`still_deferred`): a
# deferral is repeated on the next scan or two, so a burst's ~50 waiting visits a round skip
# the match; not measured
STALE = 2
# NOTE: tokens of a request compared first with each recent extend (a cheap reject before the
# full prefix compare; a speed step, not a decision)
DEFER_HEAD = 16


class SlotDeferral:
    """Chunk-slot deferrals: per request, rounds deferred and its last verdict; the last
    scans' extends (each publishes its state at its end)."""

    def __init__(self, grid: Grid, costs: RoundCosts, targets: PlacementTargets,
                 book: ReuseBook) -> None:
        self.grid = grid
        self.costs = costs
        self.targets = targets
        self.book = book
        self.deferred = 0  # rounds requests were deferred for the chunk slot
        self._defers: dict[str, int] = {}  # rid -> rounds deferred
        # NOTE: rid -> (scan, ready prefix, cut depth, key, users) of its last slot deferral
        self._waits: dict[str, tuple[int, int, int, tuple, float]] = {}
        # NOTE: (scan, [(namespace, tokens, extend end, first 16 tokens)]) of the last scans'
        # extends: no_buffer publishes each one's state at its end
        self._extends: deque[tuple[int, list[tuple]]] = deque(maxlen=STALE)

    def defer(self, scan: BoundaryScan, req: Req, tokens, ns, adder: PrefillAdder,
              slot_next: bool, running: int, cap: int = MAX_DEFER) -> bool:
        """Whether to skip `req` this round (before it consumes anything) because its boundary
        cut cannot get SGLang's one chunk slot now (`adder.new_chunked_req` is taken) but can
        next round (`slot_next`: no native chunk continues past this round), and waiting for
        it pays (core/boundary.py `defer_wins`; behind it: the unselected queue and the
        `running` requests). At most `cap` rounds each."""
        if (self.grid.layout is not Layout.NO_BUFFER or not slot_next
                or adder.new_chunked_req is None):
            return False
        prefix = req.prefix_len
        extend = len(tokens) - prefix
        source, depth = self.targets.target(scan, req, ns, prefix, extend, False, adder)
        if depth is None or self._defers.get(req.rid, 0) >= cap:
            return False
        key = scan.keys.of(req, tokens, ns, depth)
        if key in scan.serving:
            return False  # NOTE: a sibling publishes there this round: traversal's case
        users = self.book.users(scan, req, tokens, ns, depth, key, adder, source)
        if not self._wins(scan, req, tokens, prefix, depth, key, users, adder, running):
            return False
        return self._deferred(scan, req.rid, prefix, depth, key, users)

    def still_deferred(self, scan: BoundaryScan, req: Req, tokens, ns, adder: PrefillAdder,
                       slot_next: bool, running: int, cap: int = MAX_DEFER) -> bool:
        """`defer`'s verdict of a recent scan, again, before SGLang's match (docs/design.md,
        "The chunk slot"): the slot is taken again and no state was published on `req`'s path
        since (its boundary's key, or an extend of a scan since: `end_scan`), so its ready
        prefix, its cut and its users are what that scan found, and no sibling ran since; the
        queue behind it and the round's cost are read again (`_wins`). A live burst visits
        every group waiting for the slot every round (~50 deferrals a round, a match and a
        copy-on-write each: ~0.3 ms of host time per visit). NOTE: a request that finished
        since published its output's end too; only a later turn extends that, and it arrives
        after it."""
        w = self._waits.get(req.rid)
        if (w is None or w[0] < scan.number - STALE or not slot_next
                or adder.new_chunked_req is None or self.grid.layout is not Layout.NO_BUFFER):
            return False
        since, prefix, depth, key, users = w
        if (key in scan.serving or key in self.book.done
                or self._defers.get(req.rid, 0) >= cap):
            return False
        head = tokens[:DEFER_HEAD]  # NOTE: once per visit, not per extend (~50 visits a round)
        for number, extends in self._extends:
            if number < since:
                continue
            for s, t, end, t_head in extends:
                d = min(end, depth)
                if s == ns and d > prefix and head == t_head and tokens[:d] == t[:d]:
                    return False  # NOTE: a state on its path, or a sibling ran: the full rule
        if not self._wins(scan, req, tokens, prefix, depth, key, users, adder, running):
            return False
        return self._deferred(scan, req.rid, prefix, depth, key, users)

    def _deferred(self, scan: BoundaryScan, rid: str, prefix: int, depth: int, key: tuple,
                  users: float) -> bool:
        """Book a slot deferral (counted, capped, remembered for `still_deferred`); True."""
        self._defers[rid] = self._defers.get(rid, 0) + 1
        self.deferred += 1
        scan.slot_keys[key] = None
        self._waits[rid] = (scan.number, prefix, depth, key, users)
        return True

    def _wins(self, scan: BoundaryScan, req: Req, tokens, prefix: int, depth: int, key: tuple,
              users: float, adder: PrefillAdder, running: int) -> bool:
        """core/boundary.py `defer_wins`; behind the request: the unselected queue and the
        `running` requests; ahead of it: the other groups deferred for the slot this scan, when
        its users are queued now (docs/design.md, "The chunk slot")."""
        c = self.costs.fit() if self.costs.fit is not None else None
        if c is None:
            return False
        picked = sum(1 for r in adder.can_run_list if r.rid in scan.rids)
        behind = max(len(scan.queue) - picked - 1, 0) + running
        # NOTE: the slot serves one group's cut a round, in queue order, so the groups deferred
        # before it delay its cut a round each. A group queued together saves that wait by not
        # deferring (its members run now, recomputing, as stock's do); siblings still to come
        # wait for a cut whenever they arrive, so a lone request's deferral costs its usual
        # two rounds. A group: requests with its key in this scan's queue, selected or not.
        ahead = 0
        if scan.groups_at(depth).get(key, 0) > 1:
            # NOTE: the keys other than `key` (slot_keys holds each once): O(1) per visit, not
            # a pass over every group deferred so far this scan
            ahead = len(scan.slot_keys) - (key in scan.slot_keys)
        return defer_wins(c, depth - prefix, len(tokens) - depth, behind, users, ahead)

    def end_scan(self, scan: BoundaryScan, run: Sequence[Req]) -> None:
        """The scan's extends (no_buffer: each publishes its state at its end), for
        `still_deferred`."""
        if self.grid.layout is Layout.NO_BUFFER:
            self._extends.append((scan.number, [_extend(r) for r in run]))

    def rids(self) -> set[str]:
        """Requests with a deferral kept across scans."""
        return self._defers.keys() | self._waits.keys()

    def forget(self, rid: str) -> None:
        self._defers.pop(rid, None)
        self._waits.pop(rid, None)

    def keep_only(self, live: set[str]) -> None:
        self._defers = {k: v for k, v in self._defers.items() if k in live}
        self._waits = {k: v for k, v in self._waits.items() if k in live}


def _extend(r: Req) -> tuple:
    """An extend as `still_deferred` compares it: (namespace, tokens, extend end, its first
    `DEFER_HEAD` tokens). NOTE: the head is sliced once here, not once per deferred request that
    reads it."""
    tokens = req_tokens(r)
    return namespace(r), tokens, r.extend_end, tokens[:DEFER_HEAD]
