"""Quiet scans: the rule by which no candidate of a scan can wait, read off the queue as the
scan begins (docs/design.md, "Quiet scans"). The scan's `quiet` (adapter/scanstate.py) holds
the answer; with one the traversal's hooks stay off for the whole scan.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from radixflow_sglang.core.cost import never_waits
from radixflow_sglang.core.grid import Layout
from radixflow_sglang.core.producers import common_prefix
from radixflow_sglang.core.reasons import Reason, enabled
from radixflow_sglang.core.stats import RequestStats
from radixflow_sglang.core.traversal import Traversal

from .boundary import state_near
from .reqs import (
    budget_left,
    decoding,
    inflight_reqs,
    namespace,
    req_len,
    req_tokens,
    rows_running,
)
from .roundcost import RoundCost

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.managers.scheduler import Scheduler

    from .queueindex import QueueIndex

Groups = list[list[tuple[Sequence[int], "Req | None"]]]


def quiet_rule(sched: Scheduler, adder: PrefillAdder, t: Traversal,
               requests: Mapping[str, RequestStats], cost: RoundCost,
               layout: Layout, queue: QueueIndex) -> Reason | None:
    """The rule by which no candidate of this scan can wait, if one does (from rank-identical
    inputs; nothing may be parked): `quiet_scan`, no chunk continues and every queued request
    fits the round at a recompute cheaper than a round's fixed cost (core/cost.py
    `never_waits`); `unshared_scan`, no visit can find a sharer (`sharing`); `covered_scan`,
    what they share is ready already (`covered`). Boundaries still publish: their states serve
    later requests without a wait. `queue`: the scan's queue index (adapter/queueindex.py)."""
    if not queue or len(t.waits):
        return None
    if enabled(Reason.QUIET_SCAN) and sched.chunked_req is None and _never_waits(
            sched, adder, cost, queue):
        return Reason.QUIET_SCAN
    if not (enabled(Reason.UNSHARED_SCAN) or enabled(Reason.COVERED_SCAN)):
        return None
    groups = sharing(sched, t, requests, queue.queue)
    if groups is None:
        return None
    if not groups and enabled(Reason.UNSHARED_SCAN):
        return Reason.UNSHARED_SCAN
    if groups and enabled(Reason.COVERED_SCAN) and covered(sched.tree_cache, groups,
                                                           t.cfg.theta, layout):
        return Reason.COVERED_SCAN
    return None


def _never_waits(sched: Scheduler, adder: PrefillAdder, cost: RoundCost,
                 queue: QueueIndex) -> bool:
    """core/cost.py `never_waits` on this scan's facts."""
    batch = adder.running_batch  # NOTE: the scan's (adapter/reqs.py `rows_running`)
    dec = decoding(sched, batch)  # NOTE: O(rows): counted once a scan
    return never_waits(cost.fit.decision_coeffs, queue.lens, rows_running(batch),
                       int(budget_left(adder)), sched.max_running_requests, cost.host_s(),
                       adder.page_size, idle_wait(sched, cost, dec), dec)


def idle_wait(sched: Scheduler, cost: RoundCost, decoding: int) -> float | None:
    """What a wait that launches nothing costs in host time (core/cost.py
    RoundView.idle_wait_s), where one is possible: an extend in flight, nothing `decoding`
    next (Scan.launches_nothing asks the rest per candidate); None otherwise."""
    if next(inflight_reqs(sched), None) is None or decoding:
        return None
    return cost.idle_wait_s()


def sharing(sched: Scheduler, t: Traversal, requests: Mapping[str, RequestStats],
            queue: Sequence[Req]) -> Groups | None:
    """The queued requests (`queue`) and live producers (the continuing chunk, extends in flight)
    grouped by first-block chain key (namespace and tokens), the groups in which a queued
    request (the Req; a live one: None) shares with another member, each member with its
    tokens; None when a queued request has waited (a released consumer's round has its own
    DEFER rule). A sharer shares the first block (`ProducerIndex.sharers` walks from it),
    so with no group every visit would end `no_producer` or `no_sharer` (`unshared_scan`).
    Keys are the traversal's cached chains: a hash match only keeps the hooks on (the
    traversal confirms token by token)."""
    index = t.index
    live = list(inflight_reqs(sched))
    if sched.chunked_req is not None:
        live.append(sched.chunked_req)
    groups: dict[int, list[tuple[Sequence[int], Req | None]]] = {}
    for r, queued in [(r, False) for r in live] + [(r, True) for r in queue]:
        if queued and (rs := requests.get(r.rid)) is not None and rs.rounds_parked:
            return None
        if req_len(r) >= index.block:
            tokens = req_tokens(r)
            key = index.chain(r.rid, namespace(r), tokens).key(index.block)
            groups.setdefault(key, []).append((tokens, r if queued else None))
    return [g for g in groups.values() if len(g) > 1 and any(r for _, r in g)]


def covered(tree, groups: Groups, theta: int, layout: Layout) -> bool:
    """`sharing`'s groups: every queued request's ready prefix is within theta of the
    longest prefix it shares with another member (a state cached in (need - theta, need],
    `state_near`, read-only: a shared system prompt's, or extra_buffer's state at the grid
    floor of a chat template's fork a few tokens past it). A producer P blocks C only with
    a state at a depth <= common(C, P) that is theta past C's ready prefix (core/traversal.py
    `_blocking`), so every visit would end native, as with the hooks on. In a group sorted
    by tokens, a request's longest common prefix with any other is with a neighbour."""
    mamba = layout is not Layout.FULL
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
