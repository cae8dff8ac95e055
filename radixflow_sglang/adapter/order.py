"""The ORDER point (core/reasons.py): the waiting queue's visit order, set before a scan."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from radixflow_sglang.core.reasons import Reason, enabled
from radixflow_sglang.core.stats import RequestStats

from .reqs import rows_running

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.managers.scheduler import Scheduler


def recheck_first(sched: Scheduler, batch: ScheduleBatch, requests: Mapping[str, RequestStats],
                  published: Callable[[Req], bool] | None = None
                  ) -> list[tuple[Reason, int]]:
    """After SGLang's `calc_priority`: requests parked in an earlier scan (the wait set,
    rechecked) are visited before the rest, each part in SGLang's order (a stable sort). A
    released consumer needs only its tail: visited first, it takes a row a new producer would
    take, whose no_buffer cut would leave its rest alone in a round whose rows are full
    (docs/notes/2026-12-rechecked-first.md). Case `published_first` (`_published`): published
    requests go before the rest of their own arrival pass. Priority scheduling keeps SGLang's
    order. Rank-identical: `rounds_parked` counts agreed decisions, arrival passes are agreed,
    the tree and pools are every rank's. `batch`: the scan's running batch (adapter/reqs.py
    `rows_running`). The rules that decided, each with the requests it
    moved (none: SGLang's order stands)."""
    q = sched.waiting_queue
    stats = [requests.get(r.rid) for r in q]
    waited = [s is not None and s.rounds_parked > 0 for s in stats]
    n = sum(waited)
    if getattr(sched, "enable_priority_scheduling", False) and enabled(Reason.PRIORITY_ORDER):
        # NOTE: before `_published`: its tree walks could only be discarded here
        return [] if not n or all(waited[:n]) else [(Reason.PRIORITY_ORDER, n)]
    if not enabled(Reason.RECHECKED_FIRST):
        return []
    pub = _published(sched, batch, waited, n, published)
    runs, moved = [], 0  # NOTE: nothing published, nothing to move: no arrival runs needed
    if any(pub):
        runs = _runs(waited, [s.arrival if s is not None else -1 for s in stats])
        moved = _published_moves(waited, pub, runs)
    if not moved and (not n or all(waited[:n])):
        return []  # NOTE: SGLang's order stands
    _reorder(q, waited, pub, runs, moved)
    decided = []
    if n and not all(waited[:n]):
        decided.append((Reason.RECHECKED_FIRST, n))
    if moved:
        decided.append((Reason.PUBLISHED_FIRST, moved))
    return decided


def _published(sched: Scheduler, batch: ScheduleBatch, waited: list[bool], n: int,
               published: Callable[[Req], bool] | None) -> list[bool]:
    """Case `published_first`: where SGLang's row limit binds (more queued requests than rows
    free) under its FCFS order, the not-waited requests whose shared prefix is published
    already (`published`: a state within theta of the end of the KV the tree shares with it,
    a producer of an earlier round's: it needs only what no request computed). They go before
    the requests of their own arrival pass that need more: a row holds its request for its
    whole decode, so a wave of rows that takes the cheap requests first ends sooner, and the
    producers start the next wave with their siblings (docs/notes/2026-12-published-first.md).
    All False where the case cannot act."""
    q = sched.waiting_queue
    if (published is not None and len(q) - n > 1 and _fcfs(sched)
            and len(q) > sched.get_num_allocatable_reqs(rows_running(batch), running_batch=batch)):
        return [not w and published(r) for r, w in zip(q, waited, strict=True)]
    return [False] * len(q)


def _reorder(q: list, waited: list[bool], pub: list[bool], runs: list[int], moved: int) -> None:
    """The waited first; then the rest, published ones first within each arrival run (a stable
    partition: it never passes a request of an earlier pass)."""
    first = [i for i, w in enumerate(waited) if w]
    rest = [i for i, w in enumerate(waited) if not w]
    if moved:
        rest.sort(key=lambda i: (runs[i], not pub[i]))
    q[:] = [q[i] for i in first + rest]


def _fcfs(sched: Scheduler) -> bool:
    """SGLang's queue order is its arrival order (cache-aware orders rank by prefix already)."""
    policy = getattr(getattr(sched, "policy", None), "policy", None)
    return getattr(policy, "value", None) == "fcfs"


def _runs(waited: list[bool], arrival: list[int]) -> list[int]:
    """Each request's run: maximal stretches of the queue's not-waited requests from one
    arrival pass (a waited request between them does not split a run: it leads anyway)."""
    out, run, last = [], -1, None
    for w, a in zip(waited, arrival, strict=True):
        if not w and a != last:
            run, last = run + 1, a
        out.append(run)
    return out


def _published_moves(waited: list[bool], pub: list[bool], runs: list[int]) -> int:
    """Published requests behind a not-published one of their own arrival run."""
    moved, seen_unpub = 0, set()
    for w, p, r in zip(waited, pub, runs, strict=True):
        if w:
            continue
        if p and r in seen_unpub:
            moved += 1
        elif not p:
            seen_unpub.add(r)
    return moved
