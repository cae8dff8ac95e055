"""VISIT's and DEFER's facts about one request, gathered from SGLang as core/points.py `visit`
and `defer` ask for them, and VISIT's decision applied (counters, the wait set, the park).

Each fact is read at most once and only when a rule reaches it: the chain lookup for
`sharers`, the classification with nothing ready for `blocked_unready`, SGLang's probe match
(`init_next_round_input` without copy-on-write) for `blocked`, the sibling group's priced
wait for `verdict` (core/traversal.py `WaitFacts`).
"""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from radixflow_sglang.core.cost import RoundView
from radixflow_sglang.core.outcome import Blocking
from radixflow_sglang.core.reasons import Action, Reason
from radixflow_sglang.core.traversal import Candidate, WaitFacts

from . import slot
from .reqs import chunk_cut, decoding, namespace, release_parked, req_tokens

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.managers.scheduler import Scheduler

    # NOTE: not imported (runtime.py imports this module): `rt` is adapter/runtime.py's
    # RadixFlowRuntime

# NOTE: native outcomes after the traversal looked at the request: a parked one is rechecked
RELEASES = frozenset({Reason.NO_PRODUCER, Reason.NO_SHARER, Reason.NOT_BLOCKED,
                      Reason.RECOMPUTE_UNPROBED, Reason.BOUND_WOULD_CUT,
                      Reason.TAIL_GUARD, Reason.RECOMPUTE_WINS, Reason.BOUND_SPENT})
RECOMPUTES = frozenset({Reason.RECOMPUTE_UNPROBED, Reason.BOUND_WOULD_CUT,
                        Reason.TAIL_GUARD, Reason.RECOMPUTE_WINS})
VERDICTS = frozenset({Reason.COMMITTED_WAIT, Reason.BOUND_WOULD_CUT,
                      Reason.TAIL_GUARD, Reason.WAIT_WINS, Reason.RECOMPUTE_WINS})
# NOTE: VISIT's native outcomes for a request no live producer shares a prefix with: DEFER's
# fast path (`DeferFacts.still_deferred`) may repeat its slot deferral without the match
UNSHARED = frozenset({Reason.NO_TRAVERSAL, Reason.QUIET_SCAN, Reason.UNSHARED_SCAN,
                      Reason.NO_PRODUCER, Reason.NO_SHARER})


class VisitFacts:
    """core/points.py `VisitFacts` for `req` in this scan of `rt`."""

    def __init__(self, rt: Any, sched: Scheduler, req: Req,
                 adder: PrefillAdder) -> None:
        self.rt, self.sched, self.req, self.adder = rt, sched, req, adder
        self.t = rt.traversal
        self.cost_aware = rt.spec.cost_aware
        self.sibs: dict[int, int] = {}  # sibling counts by group depth (both pricings)
        self.c0: Candidate | None = None  # the candidate with nothing ready
        self.cand: Candidate | None = None  # the probed candidate
        self.b: Blocking | None = None  # what blocks it after the probe
        self.view: RoundView | None = None  # the view its group's wait was priced with

    # NOTE: read only past the scan-wide rules (a held or quiet visit never builds them)
    @cached_property
    def tokens(self):
        return req_tokens(self.req)

    @cached_property
    def ns(self) -> tuple:
        return namespace(self.req)

    # --- the facts, in the order `visit` asks them --------------------------------------------
    @property
    def held(self) -> bool:
        return self.rt.gate is not None and not self.rt.requests[self.req.rid].eligible

    @property
    def traversal(self) -> bool:
        return self.t is not None

    @property
    def quiet(self) -> Reason | None:
        return self.rt.scan.quiet

    @property
    def session(self) -> bool:
        return getattr(self.req, "session", None) is not None

    @property
    def producers(self) -> bool:
        # NOTE: none in flight, none admitted yet this scan: O(1), no lookup
        return not self.t.quiet()

    @cached_property
    def hits(self) -> list:
        return self.t.may_block(self.req.rid, self.ns, self.tokens)

    @property
    def sharers(self) -> bool:
        return bool(self.hits)

    @property
    def blocked_unready(self) -> bool:
        if self.adder.new_chunked_req is not None and self.rt.scan.fork_chunk is None:
            self.rt.scan.walk.fork_slots = 0  # NOTE: a native chunk took SGLang's one slot first
        if self.req.is_dllm():
            return True  # NOTE: no matchable length without the probe: ask it
        self.c0 = Candidate(self.req.rid, self.ns, self.tokens, 0, self._max_prefix())
        return self.t.classify(self.c0, self.hits) is not None

    @property
    def recomputes_unprobed(self) -> bool:
        if self.c0 is None or not self.cost_aware:
            return False
        return self.rt._recomputes_unprobed(self.sched, self.req, self.adder, self.c0,
                                            self.hits, self.sibs)

    @property
    def blocked(self) -> bool:
        # NOTE: probe the ready prefix without copy-on-write; admission re-matches natively
        self.rt.stats.probed += 1
        self.req.init_next_round_input(self.sched.tree_cache, cow_mamba=False)
        self.cand = Candidate(self.req.rid, self.ns, self.tokens, self.req.prefix_len,
                              self._max_prefix())
        self.b = self.t.classify(self.cand, self.hits)
        return self.b is not None

    @cached_property
    def wait(self) -> WaitFacts:
        return WaitFacts(self.t, self.cand, self.b, self._priced_view,
                         self.rt.cost.decision_coeffs)

    @property
    def committed(self) -> bool:
        return self.wait.committed

    @property
    def bound_would_cut(self) -> bool:
        return self.wait.bound_would_cut

    @property
    def verdict(self):
        return self.wait.verdict

    @property
    def bound_left(self) -> bool:
        return self.t.waits.may_park(self.req.rid)

    def _max_prefix(self) -> int:
        return self.req._compute_max_prefix_len(len(self.tokens))

    def _priced_view(self) -> RoundView:
        """The view the first of a sibling group decides with: its siblings counted, and with
        no_buffer the chunk slot's price when its wait makes the scan's fork cut."""
        rt, b = self.rt, self.b
        sib = rt.scan.siblings(self.req, self.tokens, self.t.group_depth(b), self.sibs)
        view = rt.scan.round_view(self.req, self.adder, sib, b.producer)
        self.view = slot.priced(rt, rt.scan.queue_view(), self.sched, self.req, b, view)
        return self.view

    # --- the decision applied -----------------------------------------------------------------
    def apply(self, action: Action, why: Reason) -> None:
        """Counters, the wait set, the trace's `decide` event, and a park."""
        rt, t, rid = self.rt, self.t, self.req.rid
        if why is Reason.HELD:
            rt.stats.held += 1  # NOTE: held by the timer while eligible work runs: not visited
            return
        rt.stats.visited += 1
        rt.scan.unshared = rid if why in UNSHARED else None  # NOTE: DEFER reads it next
        if why is Reason.NO_PRODUCER:
            rt.quiet_visits += 1
        if why in (Reason.NO_PRODUCER, Reason.NO_SHARER):
            rt.scan.independent = rid  # NOTE: `_newcomer_defers` reads it next
        if why in RELEASES:
            t.waits.release(rid)  # NOTE: rechecked: native handling
        if why in RECOMPUTES:
            rt.stats.recomputed += 1
        if why is Reason.BOUND_SPENT:
            t.stats.released_by_bound += 1
        waited = why in VERDICTS or (why is Reason.BOUND_SPENT and self.cost_aware)
        if waited:
            self._priced(why)
        if action is Action.PARK:
            t.park(self.cand, self.b)
            release_parked(self.sched, self.req)
            rt._apply_fork(self.b, self.adder)
            rt.requests[rid].rounds_parked += 1
            rt.scan.kept.append(rt.requests[rid].arrival)  # NOTE: its row (`Scan.rows_kept`)
            rt.scan.parked_on = self.b  # NOTE: the trace's detail of this park (`park`)

    def _priced(self, why: Reason) -> None:
        """A cost-aware verdict was reached: the Blocking it parks with (at its group's mark
        where the verdict took it), the trace's `decide` event, and a wait's parked tokens
        in the scan's view (a spent bound's too, as before its bound was checked)."""
        rt, t = self.rt, self.t
        verdict = self.wait.outcome(why)
        self.b = b = t.placed(self.cand, self.b)
        if rt.trace.on:
            # NOTE: a sibling that followed its group's verdict priced nothing: the trace shows
            # the view it would have been priced with, siblings and slot aside
            view = self.view or rt.scan.round_view(self.req, self.adder, 0, b.producer)
            rt.trace.emit({"event": "decide", "round": rt.round, "rid": self.req.rid,
                           "producer": b.producer, "ready": b.ready, "depth": b.depth,
                           "length": len(self.tokens), "fork": b.fork, "wait": verdict.wait,
                           "wait_s": verdict.wait_s, "recompute_s": verdict.recompute_s,
                           "tail": verdict.tail,
                           "view": view.__dict__,
                           "probed": True, "reason": verdict.reason})
        if verdict.wait:
            rt.scan.queue_view().parked(len(self.tokens) - b.depth)


class DeferFacts:
    """core/points.py `DeferFacts` for `req` in this scan of `rt`, after SGLang's match or
    (`matched` False) before it. `newcomer`, `slot_wait` and `still_deferred` book their
    deferral when they hold (the rule that reads them fires then)."""

    def __init__(self, rt: Any, sched: Scheduler, req: Req,
                 adder: PrefillAdder, matched: bool = True) -> None:
        self.rt, self.sched, self.req, self.adder = rt, sched, req, adder
        self.matched = matched

    @property
    def newcomer(self) -> bool:
        return self.rt._newcomer_defers(self.sched, self.req, self.adder)

    @property
    def chunking(self) -> bool:
        return self.adder.rem_chunk_tokens is not None and bool(self.adder.can_run_list)

    @property
    def slot_wait(self) -> bool:
        """no_buffer: its boundary cut must wait for SGLang's one chunk slot (adapter/boundary.py
        `BoundaryPublisher.defer`); the slot is free next round when no native chunk continues
        past this one."""
        return self._slot_deferrable() and self.rt.boundary.defer(*self._slot_facts())

    @property
    def still_deferred(self) -> bool:
        """`slot_wait`'s verdict of a recent scan, again, without the match
        (`BoundaryPublisher.still_deferred`: nothing it read has changed). NOTE: only for a
        request VISIT found no live producer sharing a prefix with, and with a chunk cut
        possible (`no_cut`'s conditions, the rule it is asked before)."""
        if self.rt.scan.unshared != self.req.rid or not self.chunking:
            return False
        return self._slot_deferrable() and self.rt.boundary.still_deferred(*self._slot_facts())

    def _slot_facts(self) -> tuple:
        """What the boundary publisher's slot deferral reads (`defer`, `still_deferred`): the
        request, its tokens and namespace, the adder, a free chunk slot, the running rows that
        decode next (adapter/reqs.py `decoding`)."""
        return (self.req, req_tokens(self.req), namespace(self.req), self.adder,
                self.sched.chunked_req is None, decoding(self.sched, self.adder.running_batch))

    def _slot_deferrable(self) -> bool:
        """A boundary publisher that can defer `req` (a session's state is its session's)."""
        return self.rt.boundary.active and getattr(self.req, "session", None) is None

    @cached_property
    def cut(self) -> int | None:
        """SGLang's cut on pages (None: it fits; 0: native's OTHER, not a fragment)."""
        return chunk_cut(self.sched, self.adder, self.req, self.adder.rem_chunk_tokens)

    @property
    def fits(self) -> bool:
        return self.cut is None

    @property
    def fork_chunk(self) -> bool:
        return self.rt.scan.fork_chunk is not None

    @property
    def fragment(self) -> bool:
        return self.rt.spec.frag and 0 < self.cut < self.rt.grid.size

    @property
    def frag_spent(self) -> bool:
        return self.rt.records.frag_deferred.get(self.req.rid, 0) >= self.rt.cfg.frag_cap
