"""ScanState: what one prefill scan knows about itself, in one object.

`RadixFlowRuntime.begin_scan` creates one per scan and the next scan's replaces it, so no
per-scan fact outlives its scan or is reset by hand. What lives longer (the wait set, the
request records, the round-cost fit, the boundary learner) stays on the runtime. A leaf: it
imports nothing of ours but the pure core.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from radixflow_sglang.core.outcome import Blocking
from radixflow_sglang.core.reasons import Reason
from radixflow_sglang.core.stats import RoundStats

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.schedule_policy import PrefillAdder
    from sglang.srt.managers.scheduler import Scheduler

    from .scanview import ScanView


@dataclass
class ScanState:
    """One scan's facts. `round`: the runtime's scan number; `stats`: its round counters."""

    round: int = 0
    stats: RoundStats = field(default_factory=lambda: RoundStats(0))
    sched: Scheduler | None = None
    # no candidate can wait, by this rule: the traversal's hooks are off
    # (`RadixFlowRuntime._quiet_scan`); None: they are on
    quiet: Reason | None = None
    # the queue's view (positions, demand, siblings): built at the first candidate needing it
    view: ScanView | None = None
    # requests selected (or continuing) this scan that a fork may still move, by rid
    reqs: dict[str, Req] = field(default_factory=dict)
    released: int = 0  # selected rows that parked before: released consumers
    finishing: int = 0  # selected rows whose next token is their last (not chunked)
    oldest: float | None = None  # the earliest stamp among the rows finishing this round
    continuing: bool | None = None  # a running row decodes on (`_older_by`, read lazily)
    # (namespace, first theta tokens) of newcomers deferred this scan: their siblings follow
    deferred_heads: list[tuple[tuple, object]] = field(default_factory=list)
    independent: str | None = None  # the last visit no live producer could block
    fork_chunk: Req | None = None  # no_buffer producer cut this scan: SGLang's one chunk slot
    # (sched.chunked_req, adder) as the scan began, until `chunk_continued` reads it
    chunk: tuple[Req | None, PrefillAdder | None] = (None, None)
    reasons: Counter[Reason] = field(default_factory=Counter)  # decisions (Prometheus)
    parked_on: Blocking | None = None  # the last visit's park: the trace's detail
