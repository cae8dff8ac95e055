"""The price of SGLang's one chunk slot (no_buffer), for the cost-aware wait rule.

A no_buffer producer publishes a state only at its extend end, so a consumer that waits for a
fork makes the producer a chunked request cut at the fork (runtime.py `_apply_fork`), and
SGLang has one chunked request per round (scheduler.py `chunked_req`). A later sibling group
in the same scan then finds no slot for its own first's cut: its siblings are not Blocked and
recompute their shared prefix beside it (qwen3.5-27b mix, rate 10, alpha 25 ms, seed 1: a RACE
group's marginal wait took the slot from a QuALITY question that arrived with it, whose
branches then computed its 2,900-token document three times). So a wait that makes the cut
costs, besides its own rounds, what the best later group would have saved with the slot
(core/cost.py `RoundView.slot_value`; docs/design.md, "The chunk slot").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from radixflow_sglang.core.cost import RoundCostEstimator, RoundView, WaitCase, group_saving
from radixflow_sglang.core.grid import Grid, Layout
from radixflow_sglang.core.outcome import Blocking
from radixflow_sglang.core.producers import common_prefix
from radixflow_sglang.core.traversal import Candidate, Traversal

from .boundary import kv_hit_length
from .reqs import namespace, req_len, req_tokens
from .scanview import SIBLING_WINDOW, ScanView

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler import Scheduler


class Scheduling(Protocol):
    """What the price reads off the runtime (adapter/runtime.py RadixFlowRuntime)."""

    traversal: Traversal
    grid: Grid
    cost: RoundCostEstimator

GROUPS = 4  # later groups priced per decision (the first ones the round can reach)


def priced(rt: Scheduling, scan: ScanView, sched: Scheduler, req: Req, b: Blocking,
           view: RoundView) -> RoundView:
    """`view` with the slot's price when waiting for `b` makes the scan's one fork cut."""
    t = rt.traversal
    p = t.index.get(b.producer)
    if not (b.fork and rt.grid.layout is Layout.NO_BUFFER and t.fork_slots == 1
            and p is not None and not p.forked):
        return view
    value = slot_value(rt, scan, sched, req, b, view)
    return replace(view, slot_value=value) if value > 0 else view


def slot_value(rt: Scheduling, scan: ScanView, sched: Scheduler, req: Req,
               b: Blocking, view: RoundView) -> float:
    """The largest saving of a later group whose first the round reaches if `req`'s group
    recomputes (its extend then takes budget): that first must not be Blocked itself, and its
    siblings' fork must lie theta past what the tree holds for it (its KV hit, a bound on its
    ready prefix: a smaller gain, so a smaller price)."""
    t, coeffs = rt.traversal, rt.cost.decision_coeffs
    theta, lag = t.cfg.theta, t.cfg.lag
    taken = req_len(req) - b.ready
    best = 0.0
    for n, (x, sibs, common, between, after) in enumerate(
            later_groups(scan, req, req_tokens(req), t.group_depth(b), theta)):
        if n >= GROUPS:
            break
        xt = req_tokens(x)
        ready = kv_hit_length(sched.tree_cache, x, xt) or 0
        reach = min(common, min(req_len(y) for y in sibs) - 1)
        depth = rt.grid.fork_depth(ready, len(xt) - ready, reach)
        if depth is None or depth - ready < theta:
            continue
        if between + taken + depth - ready > view.budget_left:
            break  # NOTE: queue order: later groups lie further still
        if t.classify(Candidate(x.rid, namespace(x), xt, ready, len(xt) - 1)) is not None:
            continue  # its first waits for a producer itself: it makes no cut of its own
        case = WaitCase(ready, depth, req_len(sibs[0]), lag, len(xt) - depth)
        vx = replace(view, siblings=len(sibs) - 1, demand_after=after, tied=0,
                     budget_left=max(view.budget_left - between - taken - (depth - ready), 0))
        best = max(best, group_saving(coeffs, case, vx))
    return best


def later_groups(scan: ScanView, req: Req, tokens, depth: int, theta: int,
                 window: int = SIBLING_WINDOW) -> Iterator[tuple[Req, list[Req], int, int, int]]:
    """Sibling groups queued after `req` and its own siblings (the next `window` entries):
    (first, its siblings, their shortest common prefix with it, input tokens queued between
    `req` and the first, input tokens queued after the first sibling). Siblings share >= theta
    tokens with their first in its namespace and sit next to it (they arrive together)."""
    i = scan.pos.get(req.rid)
    if i is None:
        return
    head, ns, q = tokens[:depth], namespace(req), scan.queue
    end = min(len(q), i + 1 + window)
    j = i + 1
    while j < end:
        x = q[j]
        xt, xns = req_tokens(x), namespace(x)
        if xns == ns and xt[:depth] == head:
            j += 1  # NOTE: one of `req`'s own siblings
            continue
        sibs, common, k = [], len(xt), j + 1
        while k < end and namespace(q[k]) == xns:
            n = common_prefix(xt, req_tokens(q[k]))
            if n < theta:
                break
            sibs.append(q[k])
            common = min(common, n)
            k += 1
        if sibs:
            yield x, sibs, common, scan.after[i + 1] - scan.after[j], scan.after[j + 2]
        j = max(k, j + 1)
