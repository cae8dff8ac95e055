"""The scan view: one scan's rank-identical picture of the waiting queue for the cost rules.

Built at a scan's first Blocked candidate over the scan's queue index (adapter/queueindex.py: its
positions and input-length suffix sums, built once per scan); the wait rule (core/cost.py
RoundView), the newcomer deferral and the chunk slot's price (slot.py) read it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from radixflow_sglang.core.cost import RoundView

from .queueindex import QueueIndex
from .reqs import budget_left, decoding, namespace, req_tokens, round_budget, rows_running

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.managers.scheduler import Scheduler


# NOTE: queue entries after a request searched for its sibling group (here and
# adapter/slot.py's later groups): siblings arrive together and sit next to each other in fcfs
# and lpm order; a bound on the cost (one compare per entry); not measured
SIBLING_WINDOW = 64


@dataclass
class ScanView:
    """Per-scan, rank-identical inputs of the cost-aware wait rule (core/cost.py RoundView):
    the waiting queue's order and token demand, the budgets, the running rows."""

    index: QueueIndex  # the scan's queue: order, positions, input-length suffix sums
    running: int  # rows of the scan's running batch (SGLang's row limit counts them)
    decoding: int  # of them, those that decode next: the requests a longer round delays
    mean_extend: float
    token_budget: int
    row_budget: int
    parked_tokens: int = 0
    parked_rows: int = 0
    # NOTE: the index's, read off it once (plain attributes: the wait rule reads them per row)
    pos: dict[str, int] = field(init=False)  # rid -> queue position
    queue: list = field(init=False)  # the waiting queue's requests, in order
    after: list[int] = field(init=False)  # after[i]: input tokens of entries i.. (demand bound)
    queued: int = field(init=False)

    def __post_init__(self) -> None:
        ix = self.index
        self.pos, self.queue, self.after, self.queued = ix.pos, ix.queue, ix.after, len(ix)

    @classmethod
    def of(cls, sched: Scheduler, index: QueueIndex, batch: ScheduleBatch) -> ScanView:
        """`index`: the scan's queue (`sched.waiting_queue` as the scan began); `batch`: its
        running batch (`adder.running_batch`, adapter/reqs.py `rows_running`)."""
        n = len(index)
        return cls(index, rows_running(batch), decoding(sched, batch),
                   index.after[0] / n if n else 1.0,
                   round_budget(sched), sched.max_running_requests)

    def siblings(self, req: Req, ns: tuple, tokens, depth: int,
                 window: int = SIBLING_WINDOW) -> int:
        """Queued requests after `req` (the next `window`) in its cache namespace that share its
        first `depth` tokens and can match past them: its sibling group (core/cost.py
        `group_wait_wins`). NOTE: siblings arrive together, so they sit next to each other in
        fcfs and lpm order; the window bounds the cost (one compare per entry, C speed)."""
        i = self.pos.get(req.rid)
        if i is None or depth <= 0:
            return 0
        head, last = tokens[:depth], tokens[depth - 1]
        n = 0
        for r in self.queue[i + 1:i + 1 + window]:
            rt = req_tokens(r)
            if (len(rt) > depth and rt[depth - 1] == last and namespace(r) == ns
                    and rt[:depth] == head):
                n += 1
        return n

    def view(self, req: Req, adder: PrefillAdder, siblings: int = 0, host_s: float = 0.0,
             arrival_rate: float = 0.0, tied: int = 0,
             older_by: float = math.inf) -> RoundView:
        run = adder.can_run_list
        i = self.pos.get(req.rid, self.queued - 1)
        left = budget_left(adder)
        selected = sum(1 for r in run if r.rid in self.pos)
        return RoundView(
            rows=len(run), behind=self.queued - selected + self.decoding,
            budget_left=max(int(left), 0), demand_after=self.after[i + 1],
            mean_extend=self.mean_extend,
            rows_left=max(self.row_budget - self.running - len(run), 0),
            parked_tokens=self.parked_tokens, parked_rows=self.parked_rows,
            token_budget=self.token_budget, row_budget=self.row_budget, siblings=siblings,
            host_s=host_s, arrival_rate=arrival_rate, tied=tied,
            older_by=older_by)  # NOTE: built once

    def passed_over(self, req: Req, run: list) -> bool:
        """A request queued before `req` was not selected this scan (parked, held, deferred):
        it finishes after this round. NOTE: the scan visits the queue in order, so every
        selected queued request but `req` itself sits before it."""
        i = self.pos.get(req.rid)
        if i is None:
            return False
        selected = sum(1 for r in run if r.rid in self.pos and r is not req)
        return i > selected

    def parked(self, extend: int) -> None:
        self.parked_tokens += extend
        self.parked_rows += 1
