"""RadixFlowRuntime: maps SGLang's Req / cache / scan onto the engine-free policy core.

One runtime lives in each scheduler process. The scan in `scan.py` calls its hooks; every
decision depends only on the waiting queue, the radix tree and the in-flight batches, which
SGLang keeps identical on all tensor-parallel ranks, so every rank decides the same.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

from radixflow_sglang.config import RadixFlowConfig  # noqa: F401  (re-export, moved there)
from radixflow_sglang.core.admission import Agreement, Followers, Gate, local_agreement
from radixflow_sglang.core.cost import (
    GENERIC_PRIOR,
    CostCoeffs,
    RoundCostEstimator,
)
from radixflow_sglang.core.grid import Grid, Layout
from radixflow_sglang.core.outcome import Blocking
from radixflow_sglang.core.points import defer, visit
from radixflow_sglang.core.producers import Producer
from radixflow_sglang.core.reasons import Action, Reason
from radixflow_sglang.core.stats import RoundStats, Totals
from radixflow_sglang.core.traversal import Candidate, Traversal, TraversalConfig

from . import check_sglang_version
from .admission import AdmissionHold, Sleep
from .boundary import BoundaryPublisher, cut_chunk, state_covers
from .facts import DeferFacts, VisitFacts
from .order import recheck_first
from .queueindex import QueueIndex
from .quiet import quiet_rule
from .records import Records
from .reporting import Reporting, summary
from .reqs import (
    cache_hit,
    inflight_reqs,
    namespace,
    release_parked,
    req_tokens,
)
from .roundcost import RoundCost
from .scanstate import Scan
from .trace import Trace

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


def no_buffer_fork_possible(sched: Scheduler, adder: PrefillAdder, layout: Layout) -> bool:
    """A no_buffer fork can cut its producer this scan. NOTE: the cut producer becomes
    SGLang's one chunked request: the slot must be free and chunked prefill on (without it
    the next scan's add_chunked_req has no budget)."""
    return (layout is Layout.NO_BUFFER and sched.chunked_req is None
            and adder.rem_chunk_tokens is not None)


class RadixFlowRuntime:
    def __init__(self, cfg: RadixFlowConfig, grid: Grid, overlap: bool, *,
                 clock=time.monotonic, sleep: Sleep = time.sleep,
                 agreement: Agreement = local_agreement, metrics=None,
                 reuse: bool = True, prior: CostCoeffs | None = None) -> None:
        """`clock`/`sleep`: what the hold reads and waits with (the twin: virtual time);
        `agreement`: shares rank 0's hold decision; `metrics`: RadixFlowMetrics in a server with
        --enable-metrics; `reuse`: False when the cache shares no prefix (--disable-radix-cache);
        `prior`: the round-cost fit's starting point (core/cost.py)."""
        self.cfg, self.grid, self.clock = cfg, grid, clock
        # NOTE: without prefix reuse nothing a producer publishes can serve a consumer, and a
        # fragment's state is never matched: traversal and the fragmentation guard are off.
        self.spec = cfg.spec if reuse else replace(cfg.spec, traversal=False, frag=False)
        tcfg = TraversalConfig.default(grid, overlap, cfg.park_margin, cfg.theta,
                                       self.spec.cost_aware)
        self.theta = tcfg.theta  # NOTE: the resolved default, for /server_info
        self.traversal = Traversal(tcfg) if self.spec.traversal else None
        self.trace = Trace(cfg.trace)
        self.roundcost = RoundCost(prior or GENERIC_PRIOR, cfg, lag=tcfg.lag,
                                   rated=self.spec.cost_aware and self.traversal is not None,
                                   clock=clock, trace=self.trace, metrics=metrics)
        # NOTE: the hold's bursts, whose heads the records drop with their request
        followers = Followers() if self.spec.admission else None
        self.records = Records(self.traversal, self._publisher(reuse), clock, followers)
        self.admission = self._hold(clock, sleep, agreement, followers)
        self.report = Reporting(self.trace, metrics, self.admission)
        self.totals, self.round = Totals(), 0
        self.scan = Scan()  # NOTE: this scan's facts; begin_scan makes a new one
        self.quiet_visits = 0  # visits that skipped the traversal: nothing could be Blocked
        self._held_since_round = 0
        self.health_checks = 0  # prefills of only SGLang's health check, run natively, uncounted

    def _publisher(self, reuse: bool) -> BoundaryPublisher:
        """The boundary publisher. NOTE: a boundary publishes for later requests: nothing to
        publish without reuse."""
        pub = BoundaryPublisher(self.cfg.boundaries if reuse else "off", self.grid,
                                cost=lambda: self.cost.round_coeffs)
        if self.spec.cost_aware:
            pub.older_by = self._older_by
        return pub

    def _older_by(self, req: Req, adder: PrefillAdder) -> float:
        """The publisher's tail guard reads the current scan's (`Scan.older_by`)."""
        return self.scan.older_by(req, adder)

    def _hold(self, clock, sleep: Sleep, agreement: Agreement,
              followers: Followers | None) -> AdmissionHold | None:
        """The admission hold (None: no admission control); it prices with the decision's fit."""
        adm, ms = self.spec.admission, self.spec.admission_ms
        self.gate = Gate(adm, ms, cost_aware=self.spec.hold_cost) if adm else None
        return None if self.gate is None else AdmissionHold(
            self.gate, self.requests, self._register, release_parked, clock=clock, sleep=sleep,
            agreement=agreement, cost=lambda: self.cost.decision_coeffs, followers=followers,
            parked_on=self.traversal.waits.producer_of if self.traversal else lambda _r: None)

    def _register(self, req: Req) -> None:
        self.records.register(req, self.round, self.roundcost.agreed_now)

    @classmethod
    def for_scheduler(cls, sched: Scheduler, cfg: RadixFlowConfig,
                      **collaborators) -> RadixFlowRuntime:
        from .costprior import scheduler_prior

        return cls(cfg, cache_grid(sched), bool(getattr(sched, "enable_overlap", False)),
                   reuse=sched.tree_cache.supports_prefix_sharing(),
                   prior=scheduler_prior(sched), **collaborators)

    # --- long-lived collaborators, by the names callers read ------------------------------------
    @property
    def requests(self):
        """Per-request RequestStats while queued (adapter/records.py)."""
        return self.records.requests

    @property
    def cost(self) -> RoundCostEstimator:
        """The round-cost fit decisions price with (adapter/roundcost.py)."""
        return self.roundcost.fit

    @property
    def boundary(self) -> BoundaryPublisher:
        return self.records.boundary  # NOTE: the records drop its keys with their request

    @boundary.setter
    def boundary(self, pub: BoundaryPublisher) -> None:
        self.records.boundary = pub  # NOTE: tests swap in a publisher of their settings

    @property
    def held_iterations(self) -> int:
        return self.admission.held_iterations if self.admission is not None else 0

    def summary(self) -> dict:
        """Counters for /server_info and metrics (adapter/reporting.py)."""
        return summary(self)

    def use_prior(self, prior) -> None:
        """Restart the round-cost fit from `prior` (anything with alpha/beta/gamma[/delta])."""
        self.roundcost.use_prior(prior)

    def observe_forward(self, rows: int, tokens: int, seconds: float,
                        host: float | None = None,
                        period: tuple[float, float] | None = None, **extra) -> float:
        """One prefill forward's measured duration, agreed across ranks and fed to the fit;
        every rank calls it for every prefill forward, in order (adapter/roundcost.py)."""
        return self.roundcost.observe_forward(self.round, rows, tokens, seconds, host, period,
                                              **extra)

    def observe_host(self, seconds: float) -> float:
        """One prefill round's scheduler CPU time, agreed (adapter/roundcost.py)."""
        return self.roundcost.observe_host(seconds)

    # --- scan hooks (called from scan.py) ------------------------------------------------------
    def begin_scan(self, sched: Scheduler, adder: PrefillAdder) -> None:
        self.round += 1
        self._order(sched, adder.running_batch)  # NOTE: before the index (its order)
        queue = QueueIndex(sched.waiting_queue)
        self.records.sweep(queue)
        scan = self.scan = Scan(self.round, sched, adder.running_batch, self.requests, queue,
                                cost=self.roundcost, boundary=self.boundary.begin_scan(queue))
        if self.traversal is None:
            scan.stats = RoundStats(self.round, t_start=self.clock())
            return
        if self.spec.cost_aware:
            self.roundcost.count_arrivals(queue.rids)
            scan.quiet = quiet_rule(sched, adder, self.traversal, self.requests, self.roundcost,
                                    self.grid.layout, queue)
            if scan.quiet is not None:
                # NOTE: no producer index, lookup, probe or sibling count: SGLang's own scan
                # plus the boundary publisher's work (eval/hostcost.py charges it apart)
                self.traversal.chains.tick()  # NOTE: quiet.py `sharing` keeps the queue's chains
                scan.stats = RoundStats(self.round, quiet=True, t_start=self.clock())
                return
        slots = 1 << 30 if self.grid.layout is Layout.EXTRA_BUFFER else 0
        if no_buffer_fork_possible(sched, adder, self.grid.layout):
            slots = 1  # NOTE: no_buffer forks by cutting the producer as SGLang's one chunk
        scan.chunk = (sched.chunked_req, adder)  # NOTE: read by chunk_continued
        scan.walk = self.traversal.begin_round(self._inflight(sched), slots)
        scan.stats = scan.walk.stats
        # NOTE: the scan's number, not the traversal's (quiet scans skip it): one count per trace
        scan.stats.round, scan.stats.t_start = self.round, self.clock()

    def _order(self, sched: Scheduler, batch) -> None:
        """The ORDER point (core/reasons.py): rechecked requests first, and where rows bind the
        published ones of each arrival pass (adapter/order.py)."""
        if self.traversal is None:
            return
        theta, mamba = self.traversal.cfg.theta, self.grid.layout is not Layout.FULL

        def published(req: Req) -> bool:
            # NOTE: its state covers what the tree shares with it (read-only)
            return state_covers(sched.tree_cache, req, req_tokens(req), theta, mamba)

        for decided in recheck_first(sched, batch, self.requests, published):
            self.report.ordered(self.round, *decided)

    @property
    def stats(self) -> RoundStats:
        """This scan's round counters."""
        return self.scan.stats

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
            self.scan.walk.fork_slots = 1
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
        if action is Action.PARK and self.trace.on:
            b = self.scan.parked_on
            self.trace.emit({"event": "parked", "round": self.round, "rid": req.rid,
                             "producer": b.producer, "depth": b.depth, "ready": b.ready,
                             "fork": b.fork, "reason": why})
        return action is not Action.NATIVE

    def rows_kept(self, sched: Scheduler, req: Req, adder: PrefillAdder, beam_width: int | None,
                  held_rows: int) -> bool:
        """The park's row (`Scan.rows_kept`): True stops the scan at `req`, traced."""
        kept = self.scan.rows_kept(sched, req, adder, beam_width, held_rows)
        if kept and self.trace.on:
            self.trace.emit({"event": "rows_kept", "round": self.round, "rid": req.rid,
                             "kept": kept, "rows": len(adder.can_run_list)})
        return kept > 0

    def _visit(self, sched: Scheduler, req: Req, adder: PrefillAdder) -> tuple[Action, Reason]:
        """The VISIT rules (core/points.py `visit`) over `req`'s facts, applied."""
        self._register(req)
        f = VisitFacts(self, sched, req, adder)
        action, why = visit(f)
        f.apply(action, why)
        return action, why

    def _decided(self, point: str, rid: str, action: Action, why: Reason) -> None:
        """Count one decision by its reason (/server_info, Prometheus) and trace it."""
        self.report.reasons[why] += 1
        self.scan.reasons[why] += 1
        if self.trace.on:
            self.trace.emit({"event": point, "round": self.round, "rid": rid,
                             "action": action, "reason": why})

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
            c0, bs, lambda b: self.scan.round_view(req, adder, self.scan.siblings(
                req, c0.tokens, t.group_depth(b), sibs), b.producer), self.cost.decision_coeffs)
        if ok and self.trace.on:
            self.trace.emit({"event": "decide", "round": self.round, "rid": req.rid,
                             "producer": bs[0].producer, "ready": None, "depth": bs[0].depth,
                             "length": len(c0.tokens), "fork": bs[0].fork, "wait": False,
                             "probed": False, "reason": Reason.RECOMPUTE_UNPROBED})
        return ok

    def after_add(self, sched: Scheduler, req: Req, adder: PrefillAdder, res) -> None:
        if not (adder.can_run_list and req is adder.can_run_list[-1]):
            return
        self.stats.ready += 1
        rs = self.requests.get(req.rid)
        if rs is not None and rs.first_selected is None:
            rs.first_selected, rs.first_selected_round = self.clock(), self.round
        self.scan.selected(req, adder, rs)
        self._publish_boundary(sched, req, adder)
        if self.trace.on:
            self.trace.admitted(self.round, req, self.grid)
        if self.traversal is not None and not self.scan.quiet:
            self.scan.reqs[req.rid] = req
            self.traversal.admitted(self._producer(req, movable=True))

    def end_scan(self, sched: Scheduler, adder: PrefillAdder) -> None:
        run = adder.can_run_list
        s = self.stats
        self._close_round(s, sched, adder)
        self.totals.add(s)
        parked = self._selected(run)
        self.report.end_round(s, parked, self.scan.reasons)
        self.trace.flush()

    def _close_round(self, s: RoundStats, sched: Scheduler, adder: PrefillAdder) -> None:
        """The round's counters as it ends; the wait set releases what was selected."""
        run = adder.can_run_list
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
        s.t_end, s.pass_s = self.clock(), self.roundcost.pass_s
        s.held += self.held_iterations - self._held_since_round
        self._held_since_round = self.held_iterations

    def _selected(self, run: list[Req]) -> list[int]:
        """The selected requests' records end (traced); the rounds each had parked."""
        parked = []
        for r in run:
            rs = self.records.selected(r.rid)
            if rs is not None:
                parked.append(rs.rounds_parked)
                self.totals.parked_max_rounds = max(self.totals.parked_max_rounds,
                                                    rs.rounds_parked)
                if self.trace.on:
                    self.trace.emit({"event": "selected", **rs.__dict__})
        return parked

    # --- admission (called from RadixFlowScheduler.get_new_batch_prefill) -------------------
    def hold(self, sched: Scheduler, running_batch) -> bool:
        """True: keep the queue out of this round (adapter/admission.py)."""
        self.records.passes += 1  # NOTE: before the hold registers this pass's arrivals
        return self.admission is not None and self.admission.hold(sched, running_batch)

    def defer(self, sched: Scheduler, req: Req, adder: PrefillAdder) -> bool:
        """The DEFER decision point (core/reasons.py): skip a request this round, before it
        consumes anything, when admitting it would cut it into a chunk: while a fork-cut
        producer holds SGLang's one chunk slot (the cut would displace it), or, under +Frag,
        when the residual chunk budget would leave a fragment that publishes no state
        (0 < cut < G; capped per request). Fit and cut are SGLang's, on pages (a cut of 0 is
        native's OTHER, not a fragment). First, the cost-aware rule's newcomer deferral
        (`_newcomer_defers`). Counted and traced by reason."""
        return self._defer(sched, req, adder, matched=True)

    def defer_unmatched(self, sched: Scheduler, req: Req, adder: PrefillAdder) -> bool:
        """The DEFER point before SGLang's match, right after VISIT handed `req` to SGLang: only
        `boundary_slot`'s fast path decides there (core/points.py `defer`); False: SGLang
        matches it and `defer` asks again. NOTE: it spares a request still waiting for the
        chunk slot its match and copy-on-write (a live burst: ~50 such visits a round)."""
        return self._defer(sched, req, adder, matched=False)

    def _defer(self, sched: Scheduler, req: Req, adder: PrefillAdder, matched: bool) -> bool:
        """The DEFER rules (core/points.py `defer`) over `req`'s facts, applied: counted and
        traced by reason; a deferral frees what the match staged; a fragment's deferral is
        counted toward its cap."""
        decided = defer(DeferFacts(self, sched, req, adder, matched))
        if decided is None:
            return False  # NOTE: before the match, no rule decided: SGLang matches it
        action, why = decided
        if why is Reason.FRAGMENT:
            fd = self.records.frag_deferred
            fd[req.rid] = fd.get(req.rid, 0) + 1
            self.stats.frag_deferred += 1
        self._decided("defer", req.rid, action, why)
        if action is Action.DEFER:
            release_parked(sched, req)
        return action is Action.DEFER

    def _newcomer_defers(self, sched: Scheduler, req: Req, adder: PrefillAdder) -> bool:
        """The cost-aware rule's newcomer deferral (adapter/scanstate.py
        `Scan.newcomer_defers`)."""
        if self.traversal is None or not self.spec.cost_aware:
            return False
        return self.scan.newcomer_defers(req, adder, self.traversal.cfg.theta)

    # --- helpers ---------------------------------------------------------------------------
    def _publish_boundary(self, sched: Scheduler, req: Req, adder: PrefillAdder) -> None:
        """Publish a selected request's state at its declared or learned boundary
        (adapter/boundary.py), before it is indexed as a producer (its publish depth)."""
        if not self.boundary.active:
            return
        # NOTE: a cut becomes SGLang's one chunked request: the slot must be free and chunked
        # prefill on (as no_buffer_fork_possible), in either layout.
        cut_ok = (self.scan.fork_chunk is None and sched.chunked_req is None
                  and adder.rem_chunk_tokens is not None)
        self.boundary.admitted(req, req_tokens(req), namespace(req), adder, cut_ok,
                               tree=sched.tree_cache)
        self.report.placed(self.round, req.rid, self.boundary.decided)
        if self.boundary.cut is req:
            self.scan.fork_chunk = req  # NOTE: it holds SGLang's one chunk slot (see defer)
            if self.scan.walk is not None:
                self.scan.walk.fork_slots = 0

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
        return [self._producer(r, movable=False) for r in inflight_reqs(sched)
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
