"""Scan: everything that lives for one prefill scan, in one object.

`RadixFlowRuntime.begin_scan` builds one per scan and the next scan's replaces it, so no
per-scan fact outlives its scan or is reset by hand: the scan's counters and selections, the
queue's one index (adapter/queueindex.py: order, positions, rids, demand sums, which the view
and the boundary publisher's scan read), the queue's view (adapter/scanview.py, built at the
first decision that needs it), the quiet rule that turned the hooks off (adapter/quiet.py) and
the traversal's round (core/traversal.py TraversalRound: its producers, fork slots, sibling
verdicts). What lives longer (the wait set, the request records, the round-cost fit, the
boundary learner) has its own owner, which the scan reads: `requests` (adapter/records.py) and
`cost` (adapter/roundcost.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from radixflow_sglang.core.cost import RoundView, newcomer_waits
from radixflow_sglang.core.outcome import Blocking
from radixflow_sglang.core.reasons import Reason
from radixflow_sglang.core.stats import RequestStats, RoundStats
from radixflow_sglang.core.traversal import TraversalRound

from .queueindex import QueueIndex
from .reqs import budget_left, last_token, namespace, req_tokens
from .scanview import ScanView

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.managers.scheduler import Scheduler

    from .boundary_scan import BoundaryScan
    from .roundcost import RoundCost


@dataclass
class Scan:
    """One scan's facts. `round`: the runtime's scan number; `stats`: its round counters."""

    round: int = 0
    sched: Scheduler | None = None
    # the scan's running batch (`adder.running_batch`: the last prefill merged into it, which
    # `sched.running_batch` is not until the scan ends; adapter/reqs.py `rows_running`)
    batch: ScheduleBatch | None = None
    requests: Mapping[str, RequestStats] = field(default_factory=dict)  # the records (read)
    # the waiting queue as the scan began, indexed once (adapter/queueindex.py): the view and
    # the boundary publisher's scan read it
    queue: QueueIndex = field(default_factory=QueueIndex)
    stats: RoundStats = field(default_factory=lambda: RoundStats(0))
    cost: RoundCost | None = None  # the round-cost fit, host time, arrival rate (read)
    # no candidate can wait, by this rule: the traversal's hooks are off (adapter/quiet.py);
    # None: they are on
    quiet: Reason | None = None
    walk: TraversalRound | None = None  # the traversal's round (None: quiet, or no traversal)
    # the boundary publisher's scan (adapter/boundary_scan.py: its queue questions, placements
    # and the cut it made), built by the publisher for this scan
    boundary: BoundaryScan | None = None
    # the queue's view (positions, demand, siblings): built at the first candidate needing it
    view: ScanView | None = None
    # requests selected (or continuing) this scan that a fork may still move, by rid
    reqs: dict[str, Req] = field(default_factory=dict)
    released: int = 0  # selected rows that parked before: released consumers
    finishing: int = 0  # selected rows whose next token is their last (not chunked)
    oldest: float | None = None  # the earliest stamp among the rows finishing this round
    continuing: bool | None = None  # a running row decodes on (`older_by`, read lazily)
    # (namespace, first theta tokens) of newcomers deferred this scan: their siblings follow
    deferred_heads: list[tuple[tuple, object]] = field(default_factory=list)
    independent: str | None = None  # the last visit no live producer could block
    # the last visit VISIT found no live producer sharing a prefix with (facts.py `UNSHARED`):
    # DEFER's fast path before SGLang's match reads it
    unshared: str | None = None
    fork_chunk: Req | None = None  # no_buffer producer cut this scan: SGLang's one chunk slot
    # (sched.chunked_req, adder) as the scan began, until `chunk_continued` reads it
    chunk: tuple[Req | None, PrefillAdder | None] = (None, None)
    reasons: Counter[Reason] = field(default_factory=Counter)  # decisions (Prometheus)
    parked_on: Blocking | None = None  # the last visit's park: the trace's detail
    kept: list[int] = field(default_factory=list)  # arrival passes of this scan's parks

    def queue_view(self) -> ScanView:
        """The queue's view, built once per scan when a decision first needs it (O(queue))."""
        if self.view is None:
            self.view = ScanView.of(self.sched, self.queue, self.batch)
        return self.view

    def rows_kept(self, sched: Scheduler, req: Req, adder: PrefillAdder,
                  beam_width: int | None, held_rows: int) -> int:
        """A parked consumer keeps its row from a later arrival: where SGLang's row limit
        binds, the rows of this scan's parks that arrived in an earlier pass than `req` count
        as taken, so `req` does not take the row of a request ahead of it that parked this
        round (next round, rechecked first, that one takes it). A burst's requests arrived
        together: among them rows go as the scan finds them. The rows kept (> 0) when they
        fill the rows SGLang left; the scan then stops as at SGLang's row limit, the running
        batch not marked full (its rows are free for the parked). 0: SGLang's own limit
        decides (also under priority preemption, where rows are SGLang's to make).
        Rank-identical: agreed decisions, arrival passes and SGLang's pools."""
        if not self.kept or sched.enable_priority_preemption:
            return 0
        taken = len(adder.can_run_list)
        rows = sched.get_num_allocatable_reqs(len(adder.running_batch.reqs), beam_width,
                                              running_batch=adder.running_batch,
                                              num_held_rows=held_rows)
        if not taken < rows <= taken + len(self.kept):
            return 0
        rs = self.requests.get(req.rid)
        arrival = rs.arrival if rs is not None else math.inf
        kept = sum(a < arrival for a in self.kept)
        return kept if rows <= taken + kept else 0

    def siblings(self, req: Req, tokens, depth: int, memo: dict[int, int]) -> int:
        """`req`'s sibling group at `depth` (ScanView.siblings), counted once per depth."""
        if depth not in memo:
            memo[depth] = self.queue_view().siblings(req, namespace(req), tokens, depth)
        return memo[depth]

    def round_view(self, req: Req, adder: PrefillAdder, siblings: int,
                   producer: str | None = None) -> RoundView:
        """The wait rule's inputs for `req` now (core/cost.py RoundView)."""
        host = self.cost.host_s()
        tied = int(self.tied(req, producer, adder))
        v = self.queue_view().view(req, adder, siblings, host, self.cost.arrival_rate,
                                   tied, self.older_by(req, adder))
        if self.launches_nothing(req, adder, siblings, producer):
            idle = self.cost.idle_wait_s()  # NOTE: a median: asked only where it is read
            if idle is not None:
                v = dataclasses.replace(v, idle_wait_s=idle)
        return v

    def launches_nothing(self, req: Req, adder: PrefillAdder, siblings: int,
                         producer: str | None) -> bool:
        """`req`'s group waiting for `producer` leaves this round empty (core/cost.py
        RoundView.idle_wait_s): the producer's forward is in flight (overlap), the round has
        selected nothing, no chunk continues, no queued request follows the group and no
        running request decodes next. Rank-identical: SGLang's queues and batches."""
        walk, view = self.walk, self.queue_view()
        if walk is None or producer not in walk.inflight or adder.can_run_list:
            return False
        i = view.pos.get(req.rid)
        if i is None or view.queued - 1 - i > siblings or self.sched.chunked_req is not None:
            return False
        return not view.decoding

    def older_by(self, req: Req, adder: PrefillAdder) -> float:
        """Seconds the oldest request finishing with this round arrived before `req` (agreed
        stamps, rank-identical; 0: none). Inf when an older one finishes after it whatever
        happens (a row decoding on, a queued request this scan passed over): the tail is
        not this round's (core/cost.py `raises_tail`)."""
        if self.continuing is None:
            b = self.batch
            self.continuing = b is not None and any(not last_token(r) for r in b.reqs)
        if self.continuing:
            return math.inf
        if self.queue_view().passed_over(req, adder.can_run_list):
            return math.inf
        rs = self.requests.get(req.rid)
        if rs is None or self.oldest is None:
            return 0.0
        return max(rs.stamp - self.oldest, 0.0)

    def tied(self, req: Req, producer: str | None, adder: PrefillAdder) -> bool:
        """`producer` was selected this scan, finishes its prefill in it, and arrived with `req`
        (registered in the same or an adjacent scan: a fork's branches, n samples): one
        question, whose latency is its last member's (core/cost.py `RoundView.tied`)."""
        p = self.reqs.get(producer) if producer is not None else None
        if p is None or p is adder.new_chunked_req:
            return False
        rp, rc = self.requests.get(producer), self.requests.get(req.rid)
        return rp is not None and rc is not None and (
            abs(rp.registered_round - rc.registered_round) <= 1)

    def selected(self, req: Req, adder: PrefillAdder, rs: RequestStats | None) -> None:
        """`req` joined this round: count a released consumer and a finishing row."""
        self.released += rs is not None and rs.rounds_parked > 0
        finishing = req is not adder.new_chunked_req and last_token(req)
        self.finishing += finishing
        if finishing and rs is not None:
            self.oldest = rs.stamp if self.oldest is None else min(self.oldest, rs.stamp)

    def newcomer_defers(self, req: Req, adder: PrefillAdder, theta: int) -> bool:
        """Keep a request no live producer shares a prefix with out of a round that runs
        released consumers when joining would make their round cost more than everyone else
        pays for one more round (core/cost.py `newcomer_waits`; once per request). Its group
        (later requests sharing theta tokens of it: its consumers had it run) stays out with
        it. The cost-aware rule's (`RadixFlowRuntime._newcomer_defers` asks)."""
        if not (self.released and self.finishing) or self.quiet:
            return False
        rs = self.requests.get(req.rid)
        if (rs is None or rs.rounds_parked or rs.deferred
                or getattr(req, "session", None) is not None):
            return False
        tokens, ns = req_tokens(req), namespace(req)
        if not any(ns == n and len(tokens) > theta and tokens[:theta] == h
                   for n, h in self.deferred_heads):
            if self.independent != req.rid or not self._newcomer_waits(req, adder):
                return False  # NOTE: one a live producer shares a prefix with is traversal's
            self.deferred_heads.append((ns, tokens[:theta]))
        rs.deferred += 1
        self.stats.newcomer_deferred += 1
        return True

    def _newcomer_waits(self, req: Req, adder: PrefillAdder) -> bool:
        extend = len(req.full_untruncated_fill_ids) - req.prefix_len
        extend = min(extend, int(budget_left(adder)))
        v = self.round_view(req, adder, 0)
        others = v.behind + v.rows - self.finishing
        taken = max(v.token_budget - v.budget_left, 0)  # NOTE: this round's tokens so far
        return newcomer_waits(self.cost.fit.decision_coeffs, req.prefix_len, extend,
                              self.finishing, others, v.parked_rows, v.host_s,
                              v.arrival_rate, v.rows, taken)
