"""The ORDER point (core/reasons.py): the waiting queue's visit order, set before a scan."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from radixflow_sglang.core.reasons import Reason, enabled
from radixflow_sglang.core.stats import RequestStats

if TYPE_CHECKING:
    from sglang.srt.managers.scheduler import Scheduler


def recheck_first(sched: Scheduler, requests: Mapping[str, RequestStats]
                  ) -> tuple[Reason, int] | None:
    """After SGLang's `calc_priority`: requests parked in an earlier scan (the wait set,
    rechecked) are visited before the rest, each part in SGLang's order (a stable sort). A
    released consumer needs only its tail: visited first, it takes a row a new producer would
    take, whose no_buffer cut would leave its rest alone in a round whose rows are full
    (docs/notes/2026-12-rechecked-first.md). Priority scheduling keeps SGLang's order.
    Rank-identical: `rounds_parked` counts agreed decisions. The rule that decided and the
    requests that waited; None when none waited or they lead already."""
    q = sched.waiting_queue
    waited = [(s := requests.get(r.rid)) is not None and s.rounds_parked > 0 for r in q]
    n = sum(waited)
    if not n or all(waited[:n]):
        return None  # NOTE: SGLang's order stands
    if getattr(sched, "enable_priority_scheduling", False) and enabled(Reason.PRIORITY_ORDER):
        return Reason.PRIORITY_ORDER, n
    if not enabled(Reason.RECHECKED_FIRST):
        return None
    q[:] = [r for r, w in zip(q, waited, strict=True) if w] + [
        r for r, w in zip(q, waited, strict=True) if not w]
    return Reason.RECHECKED_FIRST, n
