"""The admission hold: flexible admission and the timer controls on SGLang's scheduler loop.

`RadixFlowScheduler.get_new_batch_prefill` asks `AdmissionHold.hold` once per pass whether the
waiting queue stays out of this round. The rules are the engine-free `core.admission.Gate`;
this module maps SGLang's queue, running batch and budgets onto its `Demand`, shares the
clock-dependent outcome across the attention-TP group (`agreement`) and waits only while the
scheduler has nothing else to run (a hold never delays running work).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from radixflow_sglang.core.admission import (
    Agreement,
    ArrivalRate,
    Decision,
    Demand,
    Followers,
    Gate,
    local_agreement,
)
from radixflow_sglang.core.cost import CostCoeffs
from radixflow_sglang.core.reasons import Reason
from radixflow_sglang.core.stats import RequestStats

from .reqs import inflight_reqs, namespace, req_len, round_budget

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler import Scheduler

Sleep = Callable[[float], None]

# NOTE: a burst's requests (a question's branches, n samples) share far more than this; two
# unrelated prompts rarely share their first 32 tokens in one namespace (a shared system
# prompt's do: its followers are then expected as long as they keep coming)
FOLLOW_SPAN = 32  # tokens of a request's prompt that name its burst (`burst_key`)


def burst_key(req: Req) -> tuple:
    """What a request's burst shares (core/admission.py `Followers`): namespace, first tokens."""
    return namespace(req), tuple(req.origin_input_ids[:FOLLOW_SPAN])


class AdmissionHold:
    """Holds fresh arrivals (not yet eligible) out of the scan until the gate releases them.

    `requests` and `register` are the runtime's per-request records (shared with the scan
    hooks, which skip requests that are not eligible); `release` frees what a request matched
    while probing its demand (the runtime's `release_parked`); `cost`: the current round-cost
    fit (the runtime's estimator; the cost-aware flex hold weighs it against the arrival rate
    this hold measures from its registrations)."""

    def __init__(self, gate: Gate, requests: dict[str, RequestStats],
                 register: Callable[[Req], None], release: Callable[[Scheduler, Req], None], *,
                 clock: Callable[[], float] = time.monotonic, sleep: Sleep = time.sleep,
                 agreement: Agreement = local_agreement,
                 cost: Callable[[], CostCoeffs] | None = None,
                 followers: Followers | None = None,
                 parked_on: Callable[[str], str | None] = lambda _rid: None) -> None:
        self.gate = gate
        self.parked_on = parked_on  # rid -> the producer it is parked on (the wait set's)
        self.requests = requests
        self.register = register
        self.release = release
        self.clock = clock
        self.sleep = sleep
        self.agreement = agreement
        self.cost = cost
        self.arrivals = ArrivalRate()
        self.followers = followers if followers is not None else Followers()
        self.held_iterations = 0
        self.waits = 0  # holds that waited (nothing else to run)
        self.overtakes = 0
        self.release_reason = ""  # why held requests were released since the last round
        # NOTE: every pass's HOLD decision by its rule, as agreed (rank 0's where it broadcasts)
        self.reasons: Counter[Reason] = Counter()

    def hold(self, sched: Scheduler, running_batch) -> bool:
        """True: keep the queue out of this round (flexible admission / timer control)."""
        queue = sched.waiting_queue
        now = self.clock()
        # NOTE: prefill rounds launched and not processed (the overlap loop's; none without)
        in_flight = {r.rid for r in inflight_reqs(sched)}
        if not queue:
            self.followers.passed(now, in_flight)
            return False
        fresh = self._fresh(queue, now)
        self.followers.passed(now, in_flight)  # NOTE: after this pass's arrivals counted
        if not fresh:
            return False  # NOTE: a request is held once at most; parked ones are not re-held
        head = min(fresh, key=lambda r: self.requests[r.rid].seq)
        first = burst_key(head)
        demand = self._demand(sched, running_batch, queue, fresh, now, head, first, in_flight)
        decision = self._decide(demand, fresh, now)
        if not decision.hold:
            self._release(fresh, decision)
            return False
        if len(fresh) < len(queue) or sched.chunked_req is not None:
            # Eligible work waits (or a chunk continues): the round runs it; fresh requests
            # stay out of the scan (`park` skips them), so nothing overtakes them.
            return False
        self.held_iterations += 1
        self.followers.held(first)
        if not demand.busy and not in_flight:
            # NOTE: never while a forward runs: the loop processes its result after this pass
            self._wait(demand, now)
        return True

    def _queued_work(self, queue, fresh: list[Req], in_flight: set[str]) -> bool:
        """Eligible requests wait that this round can run: not those parked on a producer
        still in flight (the overlap loop's: they wait for its result, a round away), which
        would make a fresh request run alone in a round of its own. Without overlap nothing
        is in flight at a pass, and every eligible request counts."""
        if len(fresh) == len(queue):
            return False
        if not in_flight:
            return True
        held = {r.rid for r in fresh}
        return any(r.rid not in held and self.parked_on(r.rid) not in in_flight for r in queue)

    def _fresh(self, queue, now: float) -> list[Req]:
        """The queued requests not yet eligible, each registered the pass it is first seen."""
        requests, fresh = self.requests, []
        for r in queue:
            rs = requests.get(r.rid)
            if rs is None:  # NOTE: one lookup per queued request (this runs every pass)
                self.arrivals.add(now, len(r.origin_input_ids))
                self.followers.arrived(r.rid, burst_key(r), now)
                self.register(r)
                rs = requests[r.rid]
            if not rs.eligible:
                fresh.append(r)
        return fresh

    def _decide(self, demand: Demand, fresh: list[Req], now: float) -> Decision:
        """The gate's HOLD decision, a timer's per-request deadlines, agreed across ranks."""
        decision = self.gate.decide(demand, now)
        if decision.reason == Reason.DEADLINE and self.gate.mode == "timer":
            # NOTE: a timer releases each request at its own deadline, nothing earlier.
            cutoff = now - self.gate.deadline_s
            due = sum(1 for r in fresh if self.requests[r.rid].registered <= cutoff)
            decision = Decision(False, Reason.DEADLINE, due)
        if decision.reason in (Reason.DEADLINE, Reason.COST) or decision.hold:
            # NOTE: the only clock-dependent outcomes (deadline; cost reads the arrival rate).
            # Whether this is reached follows only from rank-identical rules (rows, busy,
            # tokens), so every rank of the group calls the broadcast, or none does.
            decision = self.agreement(decision)
        self.reasons[Reason(decision.reason)] += 1
        return decision

    def _wait(self, demand: Demand, now: float) -> None:
        # NOTE: only an otherwise idle scheduler waits (on its socket: an arrival wakes it);
        # with a batch running or in flight the held requests just stay out of the scan.
        wait = min(self.gate.wake_in(demand, now), self.gate.deadline_s)
        if wait > 0:
            self.waits += 1
            self.sleep(wait)
            self.followers.watched(self.clock())  # NOTE: an arrival ends the wait

    def _release(self, fresh: list[Req], decision: Decision) -> None:
        self.release_reason = decision.reason
        if decision.count >= 0:
            # NOTE: registration order is the same on every rank (requests are registered in
            # the iteration they first wait, in queue order); deadlines follow it.
            fresh = sorted(fresh, key=lambda r: self.requests[r.rid].seq)[: decision.count]
        for r in fresh:
            self.requests[r.rid].eligible = True

    def _demand(self, sched: Scheduler, running_batch, queue, fresh, now: float, head: Req,
                first: tuple, in_flight: set[str]) -> Demand:
        """What the gate sees; `head`: the oldest fresh request, `first` its burst key,
        `in_flight`: the rids of prefill rounds launched and not processed."""
        # NOTE: eligible requests still waiting are work this round will run (flex rule a).
        # A prefill in flight (the overlap loop's, its requests merged into the running batch
        # already) is not: a round released now starts only when its forward ends, so
        # holding costs nothing until then.
        busy = (any(r.rid not in in_flight for r in running_batch.reqs)
                or sched.chunked_req is not None or self._queued_work(queue, fresh, in_flight))
        rows = sched.get_num_allocatable_reqs(len(running_batch.reqs), running_batch=running_batch)
        budget = round_budget(sched)
        residual = sum(req_len(r) for r in queue)
        if residual >= budget and not busy:  # NOTE: match only when the bound alone can't decide
            residual = 0
            for r in queue:
                r.init_next_round_input(sched.tree_cache, cow_mamba=False)
                self.release(sched, r)
                residual += req_len(r) - r.prefix_len
                if residual >= budget:
                    # NOTE: the gate only asks whether the residual fills the budget (core/
                    # admission.py rule c), and the sum only grows: the rest need no match
                    break
        oldest = self.requests[head.rid].registered  # NOTE: registration order is seq order
        cost = self.cost() if self.cost is not None else None
        keys = {burst_key(r) for r in fresh}
        last = self.followers.latest(first)
        exp = self.followers.expect(first, now, self.gate.wait_left(oldest, now, last),
                                    self.gate.deadline_s)
        # NOTE: matched now even where EARLY's rules decide first: PLACE reads the prefix_len
        # of queued requests the scan has not matched (adapter/boundary_scan.py `groups_at`),
        # so a lazy match would move decisions
        extend = self._extend(sched, head) if exp.more > 0 and cost is not None else None
        return Demand(len(fresh), oldest, busy, rows, budget, residual,
                      self.arrivals.rate(now), self.arrivals.mean_length(), cost,
                      self.arrivals.burst(), exp.more, len(keys), extend,
                      exp.joined / exp.more if exp.more > 0 else 1.0, exp.late, last)

    def _extend(self, sched: Scheduler, head: Req) -> int:
        """What a follower of `head` would recompute beside it: its extend past the cached
        prefix (matched here, asked only while a follower is expected; the tree is the same
        on every rank)."""
        head.init_next_round_input(sched.tree_cache, cow_mamba=False)
        self.release(sched, head)
        return req_len(head) - head.prefix_len

    def take_release_reason(self) -> str:
        reason, self.release_reason = self.release_reason, ""
        return reason

    def count_overtakes(self, sched: Scheduler, run) -> None:
        """Timer controls: selected requests that arrived after one still waiting."""
        if self.gate.mode != "timer" or not run:
            return
        chosen = {r.rid for r in run}
        waiting = [self.requests[r.rid].registered for r in sched.waiting_queue
                   if r.rid not in chosen and r.rid in self.requests]
        if waiting:
            first = min(waiting)
            self.overtakes += sum(1 for r in run if r.rid in self.requests
                                  and self.requests[r.rid].registered > first)


def scheduler_sleep(sched: Scheduler) -> Sleep:
    """How a holding scheduler waits: on its tokenizer socket, so an arrival wakes it before the
    deadline (the attention-TP group's first rank); ranks without the socket sleep. Under DP
    attention a hold never waits: every DP rank steps in lockstep with the others (the
    per-iteration all-gathers), so one rank's wait would delay the others' running batches."""
    if getattr(sched, "attn_dp_enabled", False):
        return lambda _seconds: None

    def wait(seconds: float) -> None:
        poller = getattr(sched, "recv_from_tokenizer", None)
        if hasattr(poller, "poll"):
            poller.poll(timeout=max(1, int(seconds * 1000)))
        else:
            time.sleep(seconds)

    return wait
