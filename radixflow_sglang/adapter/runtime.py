"""RadixFlowRuntime: maps SGLang's Req / cache / scan onto the engine-free policy core.

One runtime lives in each scheduler process. The scan in `scan.py` calls its hooks; every
decision depends only on the waiting queue, the radix tree and the in-flight batches, which
SGLang keeps identical on all tensor-parallel ranks, so every rank decides the same.
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType
from typing import TYPE_CHECKING

from radixflow_sglang.config import RadixFlowConfig  # noqa: F401  (re-export, moved there)
from radixflow_sglang.core.admission import Agreement, ArrivalRate, Gate, local_agreement
from radixflow_sglang.core.cost import (
    GENERIC_PRIOR,
    CostCoeffs,
    LaunchPeriods,
    RoundCostEstimator,
    RoundView,
    never_waits,
    newcomer_waits,
)
from radixflow_sglang.core.grid import Grid, Layout
from radixflow_sglang.core.outcome import Blocking
from radixflow_sglang.core.points import defer, visit
from radixflow_sglang.core.producers import Producer, common_prefix
from radixflow_sglang.core.reasons import RULES, Action, Reason, enabled, in_rule_order
from radixflow_sglang.core.stats import RequestStats, RoundStats, Totals
from radixflow_sglang.core.traversal import Candidate, Traversal, TraversalConfig

from . import check_sglang_version
from .admission import AdmissionHold, Sleep
from .agreement import local_share
from .boundary import BoundaryPublisher, cut_chunk, state_near
from .facts import DeferFacts, VisitFacts
from .reqs import (
    budget_left,
    cache_hit,
    last_token,
    namespace,
    release_parked,
    req_len,
    req_tokens,
    running,
)
from .scanstate import ScanState
from .scanview import ScanView

check_sglang_version()

from sglang.srt.runtime_context import mamba_checkpoint_grid  # noqa: E402

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.managers.scheduler import Scheduler


def cache_grid(sched: Scheduler) -> Grid:
    cache = sched.tree_cache
    if not cache.supports_mamba():
        return Grid(Layout.FULL, sched.page_size, sched.page_size)
    layout = Layout.EXTRA_BUFFER if cache.enable_mamba_extra_buffer else Layout.NO_BUFFER
    # NOTE: lcm(mamba_cache_chunk_size, tree page), as _mamba_radix_cache_v2_req_prepare_for_extend
    return Grid(layout, mamba_checkpoint_grid(cache.page_size), cache.page_size)


TRACE_BUFFER = 1 << 16  # bytes of trace events held between flushes (a burst scan's ~15 KB)
# NOTE: VISIT reasons for a request no live producer shares a prefix with (`_still_deferred`)
UNSHARED = frozenset({Reason.NO_TRAVERSAL, Reason.QUIET_SCAN, Reason.UNSHARED_SCAN,
                      Reason.NO_PRODUCER, Reason.NO_SHARER})


def _inflight_reqs(sched: Scheduler):
    """The requests of extend batches whose results are not processed yet (overlap loop),
    retracted ones left out."""
    for batch, _ in getattr(sched, "result_queue", ()):
        if batch.forward_mode.is_extend():
            yield from (r for r in batch.reqs if not r.is_retracted)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None  # NOTE: JSON has no NaN


class RadixFlowRuntime:
    def __init__(self, cfg: RadixFlowConfig, grid: Grid, overlap: bool, *,
                 clock=time.monotonic, sleep: Sleep = time.sleep,
                 agreement: Agreement = local_agreement, metrics=None,
                 reuse: bool = True, prior: CostCoeffs | None = None) -> None:
        """`clock`/`sleep`: what the hold reads and waits with (the twin: virtual time);
        `agreement`: shares rank 0's hold decision; `metrics`: RadixFlowMetrics in a server with
        --enable-metrics; `reuse`: False when the cache shares no prefix (--disable-radix-cache);
        `prior`: the round-cost fit's starting point (core/cost.py)."""
        self.cfg = cfg
        # NOTE: without prefix reuse nothing a producer publishes can serve a consumer, and a
        # fragment's state is never matched: traversal and the fragmentation guard are off.
        self.spec = cfg.spec if reuse else replace(cfg.spec, traversal=False, frag=False)
        self.grid = grid
        self.clock = clock
        tcfg = TraversalConfig.default(grid, overlap, cfg.park_margin, cfg.theta,
                                       self.spec.cost_aware)
        self.cost = self._estimator(prior or GENERIC_PRIOR)
        # NOTE: a server's loop feeds its launches (adapter/scheduler.py); the kit feeds none
        self.periods = LaunchPeriods()
        self.share_forward = local_share  # NOTE: a server broadcasts rank 0's values
        self.arrivals = ArrivalRate()  # NOTE: new waiting-queue entries, this rank's clock
        self.arrival_rate = 0.0  # rank 0's, agreed with each prefill forward (the wait rule)
        self.agreed_now = 0.0  # rank 0's clock at the last prefill forward (request stamps)
        self._queued: set[str] = set()
        self.traversal = Traversal(tcfg) if self.spec.traversal else None
        self.theta = tcfg.theta  # NOTE: the resolved default, for /server_info
        # NOTE: a boundary publishes for later requests: nothing to publish without reuse.
        self.boundary = BoundaryPublisher(cfg.boundaries if reuse else "off", grid,
                                          cost=lambda: self.cost.round_coeffs)
        if self.spec.cost_aware:
            self.boundary.older_by = self._older_by
        self.totals = Totals()
        self.requests: dict[str, RequestStats] = {}
        self.round = 0
        self.scan = ScanState()  # NOTE: this scan's facts; begin_scan makes a new one
        # NOTE: block-buffered, flushed once per scan and per forward (`_flush`): a line-buffered
        # trace made a write per event, ~100 per no_buffer burst scan, exposed on the live loop
        self._trace = open(cfg.trace, "a", buffering=TRACE_BUFFER) if cfg.trace else None  # noqa: SIM115
        adm = self.spec.admission
        self.gate = (Gate(adm, self.spec.admission_ms, cost_aware=self.spec.hold_cost)
                     if adm else None)
        self.admission = None if self.gate is None else AdmissionHold(
            self.gate, self.requests, self._register, release_parked,
            clock=clock, sleep=sleep, agreement=agreement,
            cost=lambda: self.cost.decision_coeffs)  # NOTE: one home: the decision's fit
        self.frag_deferred: dict[str, int] = {}
        self.metrics = metrics
        self._seq = 0  # registration order
        self.quiet_visits = 0  # visits that skipped the traversal: nothing could be Blocked
        self._held_since_round = 0
        # NOTE: decisions by reason (core/reasons.py), all time (/server_info); this scan's are
        # `scan.reasons` (Prometheus, counted once per round like the other series)
        self.reasons: Counter[Reason] = Counter()
        self.order_reasons: Counter[Reason] = Counter()  # NOTE: ORDER, per request moved or kept
        self.boundary_reasons: Counter[Reason] = Counter()  # PLACE and PUBLISH, all time
        self._reported: Counter[Reason] = Counter()  # HOLD, PLACE, PUBLISH sent to Prometheus
        self.dp_rank: int | None = None  # set in a DP server: its ranks append to one trace
        self.health_checks = 0  # prefills of only SGLang's health check, run natively, uncounted

    @classmethod
    def for_scheduler(cls, sched: Scheduler, cfg: RadixFlowConfig,
                      **collaborators) -> RadixFlowRuntime:
        from .costprior import scheduler_prior

        return cls(cfg, cache_grid(sched), bool(getattr(sched, "enable_overlap", False)),
                   reuse=sched.tree_cache.supports_prefix_sharing(),
                   prior=scheduler_prior(sched), **collaborators)

    @property
    def held_iterations(self) -> int:
        return self.admission.held_iterations if self.admission is not None else 0

    @property
    def overtakes(self) -> int:
        return self.admission.overtakes if self.admission is not None else 0

    # --- scan hooks (called from scan.py) ------------------------------------------------------
    def begin_scan(self, sched: Scheduler, adder: PrefillAdder) -> None:
        self.round += 1
        if self._records() > 2 * len(sched.waiting_queue) + 1024:
            self._prune(sched)
        self._forget_departed(sched)
        self._order(sched)
        self.boundary.begin_scan(sched.waiting_queue)
        scan = self.scan = ScanState(self.round, sched=sched)
        if self.traversal is None:
            scan.stats = RoundStats(self.round, t_start=self.clock())
            return
        if self.spec.cost_aware:
            self._count_arrivals(sched.waiting_queue)
            scan.quiet = self._quiet_scan(sched, adder)
            if scan.quiet is not None:
                # NOTE: no producer index, lookup, probe or sibling count: SGLang's own scan
                # plus the boundary publisher's work (eval/hostcost.py charges it apart)
                self.traversal.chains.tick()  # NOTE: `_sharing` keeps the queue's chains
                scan.stats = RoundStats(self.round, quiet=True, t_start=self.clock())
                return
        slots = 1 << 30 if self.grid.layout is Layout.EXTRA_BUFFER else 0
        if self._no_buffer_fork_possible(sched, adder, self.grid.layout):
            slots = 1  # NOTE: no_buffer forks by cutting the producer as SGLang's one chunk
        scan.chunk = (sched.chunked_req, adder)  # NOTE: read by chunk_continued
        scan.stats = self.traversal.begin_round(self._inflight(sched), slots)
        # NOTE: the scan's number, not the traversal's (quiet scans skip it): one count per trace
        scan.stats.round, scan.stats.t_start = self.round, self.clock()

    def _order(self, sched: Scheduler) -> None:
        """The ORDER point (core/reasons.py), after SGLang's `calc_priority`: requests parked in
        an earlier scan (the wait set, rechecked) are visited before the rest, each part in
        SGLang's order (a stable sort). A released consumer needs only its tail: visited first,
        it takes a row a new producer would take, whose no_buffer cut would leave its rest
        alone in a round whose rows are full (docs/notes/2026-12-rechecked-first.md). Priority
        scheduling keeps SGLang's order. Rank-identical: `rounds_parked` counts agreed
        decisions."""
        if self.traversal is None:
            return
        q, rs = sched.waiting_queue, self.requests
        waited = [(s := rs.get(r.rid)) is not None and s.rounds_parked > 0 for r in q]
        n = sum(waited)
        if not n or all(waited[:n]):
            return  # NOTE: none waited, or they lead already: SGLang's order stands
        if getattr(sched, "enable_priority_scheduling", False) and enabled(Reason.PRIORITY_ORDER):
            why = Reason.PRIORITY_ORDER
        elif enabled(Reason.RECHECKED_FIRST):
            why = Reason.RECHECKED_FIRST
            q[:] = [r for r, w in zip(q, waited, strict=True) if w] + [
                r for r, w in zip(q, waited, strict=True) if not w]
        else:
            return
        self.order_reasons[why] += n
        if self._trace is not None:
            self._emit({"event": "order", "round": self.round, "reason": why, "waited": n})

    @property
    def stats(self) -> RoundStats:
        """This scan's round counters."""
        return self.scan.stats

    def _scan_view(self) -> ScanView:
        """The queue's view, built once per scan when a decision first needs it (O(queue))."""
        if self.scan.view is None:
            self.scan.view = ScanView.of(self.scan.sched)
        return self.scan.view

    def _quiet_scan(self, sched: Scheduler, adder: PrefillAdder) -> Reason | None:
        """The rule by which no candidate of this scan can wait, if one does (from
        rank-identical inputs; nothing may be parked): `quiet_scan`, no chunk continues and
        every queued request fits the round at a recompute cheaper than a round's fixed cost
        (core/cost.py `never_waits`); `unshared_scan`, no visit can find a sharer
        (`_sharing`); `covered_scan`, what they share is ready already (`_covered`).
        Boundaries still publish: their states serve later requests without a wait
        (docs/design.md, "Quiet scans")."""
        q = sched.waiting_queue
        if not q or len(self.traversal.waits):
            return None
        if (enabled(Reason.QUIET_SCAN) and sched.chunked_req is None
                and never_waits(self.cost.decision_coeffs, [req_len(r) for r in q],
                                running(sched), int(budget_left(adder)),
                                sched.max_running_requests, self._round_host_s(),
                                adder.page_size)):
            return Reason.QUIET_SCAN
        if not (enabled(Reason.UNSHARED_SCAN) or enabled(Reason.COVERED_SCAN)):
            return None
        groups = self._sharing(sched)
        if groups is None:
            return None
        if not groups and enabled(Reason.UNSHARED_SCAN):
            return Reason.UNSHARED_SCAN
        if groups and enabled(Reason.COVERED_SCAN) and self._covered(sched.tree_cache, groups):
            return Reason.COVERED_SCAN
        return None

    def _sharing(self, sched: Scheduler) -> list[list[tuple[Sequence[int], Req | None]]] | None:
        """The queued requests and live producers (the continuing chunk, extends in flight)
        grouped by first-block chain key (namespace and tokens), the groups in which a queued
        request (the Req; a live one: None) shares with another member, each member with its
        tokens; None when a queued request has waited (a released consumer's round has its own
        DEFER rule). A sharer shares the first block (`ProducerIndex.sharers` walks from it),
        so with no group every visit would end `no_producer` or `no_sharer` (`unshared_scan`).
        Keys are the traversal's cached chains: a hash match only keeps the hooks on (the
        traversal confirms token by token)."""
        index, records = self.traversal.index, self.requests
        live = list(_inflight_reqs(sched))
        if sched.chunked_req is not None:
            live.append(sched.chunked_req)
        groups: dict[int, list[tuple[Sequence[int], Req | None]]] = {}
        for r, queued in [(r, False) for r in live] + [(r, True) for r in sched.waiting_queue]:
            if queued and (rs := records.get(r.rid)) is not None and rs.rounds_parked:
                return None
            if req_len(r) >= index.block:
                tokens = req_tokens(r)
                key = index.chain(r.rid, namespace(r), tokens).key(index.block)
                groups.setdefault(key, []).append((tokens, r if queued else None))
        return [g for g in groups.values() if len(g) > 1 and any(r for _, r in g)]

    def _covered(self, tree, groups: list[list[tuple[Sequence[int], Req | None]]]) -> bool:
        """`_sharing`'s groups: every queued request's ready prefix is within theta of the
        longest prefix it shares with another member (a state cached in (need - theta, need],
        `state_near`, read-only: a shared system prompt's, or extra_buffer's state at the grid
        floor of a chat template's fork a few tokens past it). A producer P blocks C only with
        a state at a depth <= common(C, P) that is theta past C's ready prefix (core/traversal.py
        `_blocking`), so every visit would end native, as with the hooks on. In a group sorted
        by tokens, a request's longest common prefix with any other is with a neighbour."""
        mamba = self.grid.layout is not Layout.FULL
        theta = self.traversal.cfg.theta
        for group in groups:
            group.sort(key=lambda m: m[0])  # NOTE: array('q') compares in C, lexicographically
            shared = [0] * len(group)
            for i in range(len(group) - 1):
                n = common_prefix(group[i][0], group[i + 1][0])
                shared[i], shared[i + 1] = max(shared[i], n), n
            for (tokens, r), need in zip(group, shared, strict=True):
                if r is None:
                    continue
                # NOTE: a state is reachable up to SGLang's max prefix (length - 1: an
                # identical copy cannot use its original's end state, it can be Blocked)
                need = min(need, r._compute_max_prefix_len(len(tokens)))
                if need >= theta and not state_near(tree, r, tokens, need, theta, mamba):
                    return False
        return True

    def _count_arrivals(self, queue) -> None:
        """Requests that entered the waiting queue since the last scan (a retracted one re-enters:
        work arriving all the same), for the arrival rate the wait rule reads."""
        queued = {r.rid for r in queue}
        now = self.clock()
        for _ in range(len(queued - self._queued)):
            self.arrivals.add(now, 0)
        self._queued = queued

    def chunk_continued(self, sched: Scheduler, req: Req | None) -> None:
        """The continuing chunked request's chunk publishes too. NOTE: `req` is what
        `PrefillAdder.add_chunked_req` returned, None when this chunk ends the request's
        prefill: that last chunk, the one that reaches a long shared prefix's end, is the
        request begin_scan saw as `sched.chunked_req`, admitted when it is in can_run_list."""
        chunk, adder = self.scan.chunk
        self.scan.chunk = (None, None)
        if self.scan.quiet is not None:
            return  # NOTE: hooks off (an unshared scan: nothing can wait for its state)
        last = (req is None and self.traversal is not None and adder is not None
                and self.grid.layout is Layout.NO_BUFFER and adder.rem_chunk_tokens is not None)
        if last:
            # NOTE: its last chunk runs now and frees SGLang's one chunk slot for this scan
            # (stock cuts a new chunk in the same round); begin_scan saw the slot taken
            self.traversal.fork_slots = 1
        req = req if req is not None else chunk
        if req is None or self.traversal is None or req.extend_end is None:
            return
        if req.extend_end > req.prefix_len and any(r is req for r in adder.can_run_list):
            # NOTE: its batch is not prepared yet, so extra_buffer can still move its publish
            # depth to a fork (mamba_branching_seqlen, relative to the chunk's own prefix);
            # a no_buffer chunk that continues holds SGLang's one chunk slot: never cut again;
            # its last chunk may be cut at a fork (it becomes the chunked request again, as
            # a request admitted in this scan would, `_apply_fork`)
            movable = self.grid.layout is Layout.EXTRA_BUFFER or last
            if movable:
                self.scan.reqs[req.rid] = req
            self.traversal.admitted(self._producer(req, movable=movable))

    def park(self, sched: Scheduler, req: Req, adder: PrefillAdder) -> bool:
        """The VISIT decision point (core/reasons.py): True keeps `req` out of this round
        (held or parked); False hands it to native handling. Counted and traced by reason."""
        action, why = self._visit(sched, req, adder)
        self._decided("park", req.rid, action, why)
        if action is Action.PARK and self._trace is not None:
            b = self.scan.parked_on
            self._emit({"event": "parked", "round": self.round, "rid": req.rid,
                        "producer": b.producer, "depth": b.depth, "ready": b.ready,
                        "fork": b.fork, "reason": why})
        if action is Action.NATIVE and why in UNSHARED and self._still_deferred(sched, req, adder):
            # NOTE: the DEFER point decides before SGLang's match, as it did last scan
            self._decided("defer", req.rid, Action.DEFER, Reason.BOUNDARY_SLOT)
            release_parked(sched, req)
            return True
        return action is not Action.NATIVE

    def _still_deferred(self, sched: Scheduler, req: Req, adder: PrefillAdder) -> bool:
        """no_buffer: `req` waited for the chunk slot last scan and nothing it could reuse
        changed since (adapter/boundary.py `BoundaryPublisher.still_deferred`): defer it without
        the match and the DEFER rules before it (`no_cut`'s conditions checked here)."""
        if (not enabled(Reason.BOUNDARY_SLOT) or not self.boundary.active
                or adder.rem_chunk_tokens is None or not adder.can_run_list
                or getattr(req, "session", None) is not None):
            return False
        return self.boundary.still_deferred(req, req_tokens(req), namespace(req), adder,
                                            sched.chunked_req is None, running(sched))

    def _visit(self, sched: Scheduler, req: Req, adder: PrefillAdder) -> tuple[Action, Reason]:
        """The VISIT rules (core/points.py `visit`) over `req`'s facts, applied."""
        self._register(req)
        f = VisitFacts(self, sched, req, adder)
        action, why = visit(f)
        f.apply(action, why)
        return action, why

    def _decided(self, point: str, rid: str, action: Action, why: Reason) -> None:
        """Count one decision by its reason (/server_info, Prometheus) and trace it."""
        self.reasons[why] += 1
        self.scan.reasons[why] += 1
        if self._trace is not None:
            self._emit({"event": point, "round": self.round, "rid": rid, "action": action,
                        "reason": why})

    def _recomputes_unprobed(self, sched: Scheduler, req: Req, adder: PrefillAdder,
                             c0: Candidate, hits: list, sibs: dict[int, int]) -> bool:
        """The cost-aware rule recomputes `req` at every ready prefix it could have (`c0`:
        none): no probe match (core/traversal.py `recomputes_unprobed`). `sibs`: sibling
        counts by group depth, kept for the probe path."""
        t = self.traversal
        bs = t.blockings(c0, hits)
        if not bs:
            return False
        ok = t.recomputes_unprobed(
            c0, bs, lambda b: self._view(req, adder, self._siblings(
                req, c0.tokens, t.group_depth(b), sibs), b.producer), self.cost.decision_coeffs)
        if ok and self._trace is not None:
            self._emit({"event": "decide", "round": self.round, "rid": req.rid,
                        "producer": bs[0].producer, "ready": None, "depth": bs[0].depth,
                        "length": len(c0.tokens), "fork": bs[0].fork, "wait": False,
                        "probed": False, "reason": Reason.RECOMPUTE_UNPROBED})
        return ok

    def _siblings(self, req: Req, tokens, depth: int, memo: dict[int, int]) -> int:
        if depth not in memo:
            memo[depth] = self._scan_view().siblings(req, namespace(req), tokens, depth)
        return memo[depth]

    def _view(self, req: Req, adder: PrefillAdder, siblings: int,
              producer: str | None = None) -> RoundView:
        host = self._round_host_s()
        tied = int(self._tied(req, producer, adder))
        return self._scan_view().view(req, adder, siblings, host, self.arrival_rate, tied,
                               self._older_by(req, adder))

    def _round_host_s(self) -> float:
        """Host time the wait rule adds to a round beside the coefficients': none once the
        round's wall period is measured (it is in their fixed cost then, overlap included);
        else the measured scan time, only without overlap (it hides behind the forward)."""
        if self.cost.measures_wall or self.traversal.cfg.lag > 1:
            return 0.0
        return self.cost.host_s

    def _older_by(self, req: Req, adder: PrefillAdder) -> float:
        """Seconds the oldest request finishing with this round arrived before `req` (agreed
        stamps, rank-identical; 0: none). Inf when an older one finishes after it whatever
        happens (a row decoding on, a queued request this scan passed over): the tail is
        not this round's (core/cost.py `raises_tail`)."""
        if self.scan.continuing is None:
            b = self.scan.sched.running_batch
            self.scan.continuing = b is not None and any(not last_token(r) for r in b.reqs)
        if self.scan.continuing:
            return math.inf
        if self._scan_view().passed_over(req, adder.can_run_list):
            return math.inf
        rs = self.requests.get(req.rid)
        if rs is None or self.scan.oldest is None:
            return 0.0
        return max(rs.stamp - self.scan.oldest, 0.0)

    def _tied(self, req: Req, producer: str | None, adder: PrefillAdder) -> bool:
        """`producer` was selected this scan, finishes its prefill in it, and arrived with `req`
        (registered in the same or an adjacent scan: a fork's branches, n samples): one question,
        whose latency is its last member's (core/cost.py `RoundView.tied`). Rank-identical."""
        p = self.scan.reqs.get(producer) if producer is not None else None
        if p is None or p is adder.new_chunked_req:
            return False
        rp, rc = self.requests.get(producer), self.requests.get(req.rid)
        return rp is not None and rc is not None and (
            abs(rp.registered_round - rc.registered_round) <= 1)

    def after_add(self, sched: Scheduler, req: Req, adder: PrefillAdder, res) -> None:
        if not (adder.can_run_list and req is adder.can_run_list[-1]):
            return
        self.stats.ready += 1
        rs = self.requests.get(req.rid)
        if rs is not None and rs.first_selected is None:
            rs.first_selected, rs.first_selected_round = self.clock(), self.round
        scan = self.scan
        scan.released += rs is not None and rs.rounds_parked > 0
        finishing = req is not adder.new_chunked_req and last_token(req)
        scan.finishing += finishing
        if finishing and rs is not None:
            scan.oldest = rs.stamp if scan.oldest is None else min(scan.oldest, rs.stamp)
        self._publish_boundary(sched, req, adder)
        if self._trace is not None:
            self._emit_admitted(req)
        if self.traversal is not None and not self.scan.quiet:
            self.scan.reqs[req.rid] = req
            self.traversal.admitted(self._producer(req, movable=True))

    def end_scan(self, sched: Scheduler, adder: PrefillAdder) -> None:
        run = adder.can_run_list
        s = self.stats
        s.rows = len(run)
        s.scheduled_tokens = sum(r.extend_end - r.prefix_len for r in run)
        s.hit_tokens = sum(cache_hit(r) for r in run)
        s.other = s.visited - s.ready - s.blocked
        s.chunked = adder.new_chunked_req is not None or sched.chunked_req is not None
        if self.traversal is not None:
            if len(self.traversal.waits):  # NOTE: else nothing to release
                self.traversal.end_round(r.rid for r in run)
            s.wait_set = len(self.traversal.waits)
        if self.admission is not None:
            s.released_by_admission = self.admission.take_release_reason()
            self.admission.count_overtakes(sched, run)
        self.boundary.end_scan(run)
        s.t_end = self.clock()
        s.held += self.held_iterations - self._held_since_round
        self._held_since_round = self.held_iterations
        self.totals.add(s)
        parked = []
        for r in run:
            rs = self.requests.pop(r.rid, None)
            self._selected(r.rid)
            if rs is not None:
                parked.append(rs.rounds_parked)
                self.totals.parked_max_rounds = max(self.totals.parked_max_rounds,
                                                    rs.rounds_parked)
                if self._trace is not None:
                    self._emit({"event": "selected", **rs.__dict__})
        if self.metrics is not None:
            self.metrics.on_round(s, parked, s.held)
            if hasattr(self.metrics, "on_reasons"):
                self.metrics.on_reasons(self.scan.reasons + self._unreported_reasons())
        if (s.rows or s.blocked) and self._trace is not None:  # NOTE: as_dict is not free
            self._emit({"event": "round", **s.as_dict()})
        self._flush()

    def _unreported_reasons(self) -> Counter[Reason]:
        """HOLD, ORDER, PLACE and PUBLISH decisions since the last round's report (they are
        counted where they happen, apart from the scan's VISIT and DEFER ones)."""
        now = (self.boundary_reasons + self.order_reasons
               + (self.admission.reasons if self.admission else Counter()))
        fresh, self._reported = now - self._reported, now
        return fresh

    def use_prior(self, prior) -> None:
        """Restart the round-cost fit from `prior` (anything with alpha/beta/gamma[/delta])."""
        self.cost = self._estimator(CostCoeffs(
            prior.alpha, prior.beta, prior.gamma, getattr(prior, "delta", 0.0),
            getattr(prior, "source", "custom")))

    def _estimator(self, prior: CostCoeffs) -> RoundCostEstimator:
        """A round-cost fit from `prior`, its wall overhead pinned by
        --radixflow-round-overhead-ms (None: measured)."""
        ms = self.cfg.round_overhead_ms
        return RoundCostEstimator(prior, wall=None if ms is None else ms / 1e3)

    def observe_forward(self, rows: int, tokens: int, seconds: float,
                        host: float | None = None,
                        period: tuple[float, float] | None = None, **extra) -> float:
        """One prefill forward's measured duration: agreed across ranks (rank 0's value),
        recorded in the trace, fed to the round-cost fit. Every rank must call it for every
        prefill forward in the same order (it runs a collective in a server). `host`: the
        round's scheduler CPU time, agreed in the same broadcast and fed as `observe_host`
        (None on every rank, or on none). The cost-aware rule's arrival rate (a clock reading)
        rides the same broadcast. `extra`: `pairs` (full-attention query-key pairs, fitted as a
        term) and anything worth tracing. `period`: the previous prefill round's wall period
        (LaunchPeriods; NaN: unknown) and that round's forward as the loop's wall saw it,
        agreed in the same broadcast and fed to the wall overhead every decision prices a round
        with (None on every rank, or on none: the kit feeds none)."""
        rated = self.spec.cost_aware and self.traversal is not None
        values = (seconds,) + (() if host is None else (host,)) + (period or ())
        if rated:
            now = self.clock()
            values += (now, self.arrivals.rate(now))
        agreed = iter(self.share_forward(*values))
        seconds = float(next(agreed))
        if host is not None:
            self.cost.observe_host(float(next(agreed)))
        if period is not None:
            p, f = float(next(agreed)), float(next(agreed))
            self.cost.observe_period(p, f)
            extra |= {"period_s": _finite(p), "period_forward_s": _finite(f),
                      "wall_s": self.cost.wall_s}  # NOTE: what decisions add to a round now
        if rated:
            self.agreed_now, self.arrival_rate = (float(v) for v in agreed)
        pairs = float(extra.get("pairs", 0.0))
        accepted = self.cost.observe(rows, tokens, seconds, pairs)
        self._emit({"event": "forward", "round": self.round, "rows": rows,
                    "scheduled_tokens": tokens, "duration_s": seconds, "accepted": accepted,
                    **extra})
        self._flush()
        if self.metrics is not None and hasattr(self.metrics, "on_forward"):
            self.metrics.on_forward(seconds, self.cost.coeffs)
        return seconds

    def observe_host(self, seconds: float) -> float:
        """One prefill round's scheduler CPU time (scan + batch preparation): agreed across
        ranks like a forward (every rank calls it for the same rounds, in order), fed to the
        host-time estimate the wait rule adds to a round without overlap."""
        seconds = float(self.share_forward(seconds)[0])
        self.cost.observe_host(seconds)
        return seconds

    def summary(self) -> dict:
        """Counters for /server_info and metrics (plain data)."""
        t = self.totals
        return {
            "policy": self.spec.name, "composition": self.spec.describe(),
            "wait_rule": (None if self.traversal is None
                          else "cost-aware" if self.spec.cost_aware else "always"),
            "recomputed": t.recomputed, "quiet_scans": t.quiet_scans,
            "cost": self.cost.as_dict(),
            "grid": self.grid.size, "layout": self.grid.layout.value,
            "rounds": t.rounds, "blocked": t.blocked, "forks": t.forks,
            "released_by_bound": t.released_by_bound, "parked_max_rounds": t.parked_max_rounds,
            "frag_deferred": t.frag_deferred, "newcomer_deferred": t.newcomer_deferred,
            "scheduled_tokens": t.scheduled_tokens,
            "hit_tokens": t.hit_tokens, "held_iterations": self.held_iterations,
            "overtakes": self.overtakes,
            "wait_set": len(self.traversal.waits) if self.traversal is not None else 0,
            "records": self.record_counts(),
            "boundaries": self.boundary.summary(), "health_checks": self.health_checks,
            "settings": {**self.cfg.settings(), "theta": self.theta},
            "reasons": self.reason_counts(),
            "hold_reasons": self.hold_reason_counts(),
            "order_reasons": in_rule_order(self.order_reasons),
            "boundary_reasons": in_rule_order(self.boundary_reasons),
        }

    def reason_counts(self) -> dict[str, int]:
        """Visit and defer decisions made so far by reason, in the rulebook's order (their sum
        is the number of decisions: one per `park` and one per `defer` call)."""
        return in_rule_order(self.reasons)

    def hold_reason_counts(self) -> dict[str, int]:
        """The admission hold's decisions so far by reason, in the rulebook's order: one per
        scheduler pass that found fresh requests to hold or release (many passes per round
        while a hold lasts), so they are kept apart from `reasons`."""
        if self.admission is None:
            return {}
        return in_rule_order(self.admission.reasons)

    # --- admission (called from RadixFlowScheduler.get_new_batch_prefill) -------------------
    def hold(self, sched: Scheduler, running_batch) -> bool:
        """True: keep the queue out of this round (adapter/admission.py)."""
        return self.admission is not None and self.admission.hold(sched, running_batch)

    def defer(self, sched: Scheduler, req: Req, adder: PrefillAdder) -> bool:
        """The DEFER decision point (core/reasons.py): skip a request this round, before it
        consumes anything, when admitting it would cut it into a chunk: while a fork-cut
        producer holds SGLang's one chunk slot (the cut would displace it), or, under +Frag,
        when the residual chunk budget would leave a fragment that publishes no state
        (0 < cut < G; capped per request). Fit and cut are SGLang's, on pages (a cut of 0 is
        native's OTHER, not a fragment). First, the cost-aware rule's newcomer deferral
        (`_newcomer_defers`). Counted and traced by reason."""
        action, why = self._defer(sched, req, adder)
        self._decided("defer", req.rid, action, why)
        if action is Action.DEFER:
            release_parked(sched, req)
        return action is Action.DEFER

    def _defer(self, sched: Scheduler, req: Req, adder: PrefillAdder) -> tuple[Action, Reason]:
        """The DEFER rules (core/points.py `defer`) over `req`'s facts; a fragment's deferral
        is counted toward its cap."""
        action, why = defer(DeferFacts(self, sched, req, adder))
        if why is Reason.FRAGMENT:
            self.frag_deferred[req.rid] = self.frag_deferred.get(req.rid, 0) + 1
            self.stats.frag_deferred += 1
        return action, why

    def _newcomer_defers(self, sched: Scheduler, req: Req, adder: PrefillAdder) -> bool:
        """Keep a request no live producer shares a prefix with out of a round that runs
        released consumers when joining would make their round cost more than everyone else
        pays for one more round (core/cost.py `newcomer_waits`; once per request). Its group
        (later requests sharing theta tokens of it: its consumers had it run) stays out with
        it. Cost-aware rule only."""
        scan = self.scan
        if not (scan.released and scan.finishing) or scan.quiet or self.traversal is None:
            return False
        rs = self.requests.get(req.rid)
        if (not self.spec.cost_aware or rs is None or rs.rounds_parked or rs.deferred
                or getattr(req, "session", None) is not None):
            return False
        tokens, ns = req_tokens(req), namespace(req)
        theta = self.traversal.cfg.theta
        if not any(ns == n and len(tokens) > theta and tokens[:theta] == h
                   for n, h in self.scan.deferred_heads):
            if self.scan.independent != req.rid:
                return False  # NOTE: one a live producer shares a prefix with is traversal's
            extend = len(req.full_untruncated_fill_ids) - req.prefix_len
            extend = min(extend, int(budget_left(adder)))
            v = self._view(req, adder, 0)
            others = v.behind + v.rows - self.scan.finishing
            taken = max(v.token_budget - v.budget_left, 0)  # NOTE: this round's tokens so far
            if not newcomer_waits(self.cost.decision_coeffs, req.prefix_len, extend,
                                  self.scan.finishing, others, v.parked_rows, v.host_s,
                                  v.arrival_rate, v.rows, taken):
                return False
            self.scan.deferred_heads.append((ns, tokens[:theta]))
        rs.deferred += 1
        self.stats.newcomer_deferred += 1
        return True

    # --- helpers ---------------------------------------------------------------------------
    def _publish_boundary(self, sched: Scheduler, req: Req, adder: PrefillAdder) -> None:
        """Publish a selected request's state at its declared or learned boundary
        (adapter/boundary.py), before it is indexed as a producer (its publish depth)."""
        if not self.boundary.active:
            return
        # NOTE: a cut becomes SGLang's one chunked request: the slot must be free and chunked
        # prefill on (as _no_buffer_fork_possible), in either layout.
        cut_ok = (self.scan.fork_chunk is None and sched.chunked_req is None
                  and adder.rem_chunk_tokens is not None)
        self.boundary.admitted(req, req_tokens(req), namespace(req), adder, cut_ok,
                               tree=sched.tree_cache)
        self._boundary_decided(req.rid)
        if self.boundary.cut is req:
            self.scan.fork_chunk = req  # NOTE: it holds SGLang's one chunk slot (see defer)
            if self.traversal is not None:
                self.traversal.fork_slots = 0

    def _boundary_decided(self, rid: str) -> None:
        """Count the PLACE and PUBLISH rules that decided `rid`'s boundary; trace a `cut` event
        when a boundary was placed or a no_buffer mark set."""
        d = self.boundary.decided
        if d is None:
            return  # NOTE: boundaries off, or full attention: nothing was asked
        self.boundary_reasons[d.placed] += 1
        if d.how is not None:
            self.boundary_reasons[d.how] += 1
        if self._trace is not None and (d.how is not None or d.mark is not None):
            why = d.how or d.placed
            self._emit({"event": "cut", "round": self.round, "rid": rid, "placed": d.placed,
                        "reason": why, "action": RULES[why].action, "depth": d.depth,
                        "mark": d.mark})

    def _boundary_defer(self, sched: Scheduler, req: Req, adder: PrefillAdder) -> bool:
        """no_buffer: skip a request whose boundary cut must wait for SGLang's one chunk slot
        (adapter/boundary.py `BoundaryPublisher.defer`); the slot is free next round when no
        native chunk continues past this one."""
        if not self.boundary.active or getattr(req, "session", None) is not None:
            return False
        return self.boundary.defer(req, req_tokens(req), namespace(req), adder,
                                   sched.chunked_req is None, running(sched))

    def forget(self, rid: str) -> None:
        """The request left the queue without being selected (aborted, retracted, or gone by a
        path no hook saw, `_forget_departed`): drop every record of it, here, in the
        traversal (wait set, wait history, hash chain) and in the boundary publisher."""
        self.requests.pop(rid, None)
        self._selected(rid)
        if self.traversal is not None:
            self.traversal.forget(rid)

    def _selected(self, rid: str) -> None:
        """`rid` left the queue selected (or, via `forget`, not): drop the records that only a
        queued request reads (its fragment deferrals, wait history, the boundary publisher's
        keys and slot deferrals). Its hash chain stays: in flight it is a producer next scan
        (`TokenChains.tick` ages it out)."""
        self.frag_deferred.pop(rid, None)
        self.boundary.forget(rid)
        if self.traversal is not None:
            self.traversal.waits.forget(rid)

    def _forget_departed(self, sched: Scheduler) -> None:
        """A parked request that is no longer queued left by a path no hook saw: forget it, so
        the wait set holds only queued requests (a stale entry would keep every later scan off
        its quiet path). SGLang's aborts of queued requests call `forget` at once
        (adapter/scheduler.py `_release_aborted_request`); this is the guard behind it."""
        waits = self.traversal.waits if self.traversal is not None else ()
        if not len(waits):
            return
        queued = {r.rid for r in sched.waiting_queue}
        for rid in [rid for rid in waits.rids() if rid not in queued]:
            self.forget(rid)

    def parked_rounds(self) -> Mapping[str, int]:
        """Rounds each request has parked so far, kept until it leaves the queue (read-only)."""
        waits = self.traversal.waits.total_rounds if self.traversal is not None else {}
        return MappingProxyType(waits)

    def parked(self) -> list[str]:
        """Requests in the wait set now."""
        return self.traversal.waits.rids() if self.traversal is not None else []

    def _records(self) -> int:
        waits = self.traversal.waits.total_rounds if self.traversal is not None else ()
        return len(self.requests) + len(waits)

    def record_counts(self) -> dict[str, int]:
        """Per-request records kept now, by owner (/server_info `radixflow.records`): each
        ends when its request leaves the queue (`forget`, `_selected`), so an idle server
        reads all zeros. The traversal's hash chains are a cache aged by scans, not counted."""
        t = self.traversal
        return {"requests": len(self.requests), "frag_deferred": len(self.frag_deferred),
                "wait_set": len(t.waits) if t is not None else 0,
                "wait_history": len(t.waits.total_rounds) if t is not None else 0,
                "boundary": self.boundary.records()}

    def _prune(self, sched: Scheduler) -> None:
        """Drop the records of requests that left the queue without the runtime seeing them go
        (no hook saw them: SGLang's aborts call `forget`, selection `_selected`); a sweep behind
        those, run when the records outgrow the queue."""
        live = {r.rid for r in sched.waiting_queue}
        waits = self.traversal.waits.total_rounds if self.traversal is not None else {}
        for rid in [rid for rid in (*self.requests, *waits) if rid not in live]:
            self.forget(rid)

    def _register(self, req: Req) -> None:
        if req.rid not in self.requests:
            self._seq += 1
            self.requests[req.rid] = RequestStats(req.rid, self.clock(), seq=self._seq,
                                                  registered_round=self.round,
                                                  stamp=self.agreed_now)

    def _producer(self, req: Req, movable: bool) -> Producer:
        prefix, end = req.prefix_len, req.extend_end
        extend = end - prefix
        publish = self.grid.planned_depth(prefix, extend, req.mamba_branching_seqlen)
        # NOTE: a slice, not list(): origin_input_ids is an array (list() costs ~50 ns/token);
        # `source` lets the index reuse the chain hashed while the request waited
        tokens = req_tokens(req)
        return Producer(req.rid, namespace(req), tokens[:end], prefix, extend, publish,
                        movable, source=tokens, mark=self.boundary.fork_mark(req.rid))

    def _inflight(self, sched: Scheduler) -> list[Producer]:
        """Producers of extend batches whose results are not processed yet (overlap loop)."""
        return [self._producer(r, movable=False) for r in _inflight_reqs(sched)
                if r.extend_end > r.prefix_len]

    def _apply_fork(self, b: Blocking, adder: PrefillAdder) -> None:
        """Make the producer publish at the fork depth (before prepare_for_extend reads it)."""
        if not b.fork:
            return
        p = self.traversal.index.get(b.producer)
        req = self.scan.reqs[b.producer]
        if self.grid.layout is Layout.EXTRA_BUFFER:
            # NOTE: read by ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend.
            req.mamba_branching_seqlen = p.publish
            return
        if req.extend_end <= p.publish:
            return  # NOTE: no_buffer: the extend already ends at the fork
        assert adder.new_chunked_req in (None, req)
        self.scan.fork_chunk = req
        cut_chunk(req, p.publish, adder)  # NOTE: Grid.fork_depth cuts on a page
        p.extend = p.publish - p.prefix
        if p.publish == p.mark:
            self.boundary.fork_cut(req, req_tokens(req), namespace(req), p.publish)

    @staticmethod
    def _no_buffer_fork_possible(sched: Scheduler, adder: PrefillAdder,
                                 layout: Layout | None = None) -> bool:
        # NOTE: the cut producer becomes SGLang's one chunked request: the slot must be free
        # and chunked prefill on (without it the next scan's add_chunked_req has no budget).
        # `layout`: the runtime's grid's (cache_grid per scan cost a grid derivation).
        layout = cache_grid(sched).layout if layout is None else layout
        return (layout is Layout.NO_BUFFER and sched.chunked_req is None
                and adder.rem_chunk_tokens is not None)

    def _emit_admitted(self, req: Req) -> None:
        """Trace: a request native admission took: the depth it resumes from (its ready prefix,
        the part of it a cache hit), its extend and where it publishes its state as planned
        now (a consumer's fork may still move it: the consumer's `parked` event)."""
        extend = req.extend_end - req.prefix_len
        self._emit({"event": "admitted", "round": self.round, "rid": req.rid,
                    "prefix": req.prefix_len, "hit": cache_hit(req), "extend": extend,
                    "publish": self.grid.planned_depth(req.prefix_len, extend,
                                                       req.mamba_branching_seqlen)})

    def _flush(self) -> None:
        """The trace's events so far to the file (a reader sees whole scans and forwards)."""
        if self._trace is not None:
            self._trace.flush()

    def _emit(self, record: dict) -> None:
        if self._trace is not None:
            if self.dp_rank is not None:
                record = {"dp_rank": self.dp_rank, **record}
            self._trace.write(json.dumps(record, default=str) + "\n")
