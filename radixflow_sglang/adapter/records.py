"""Records: what the runtime keeps of each queued request across scans, in one owner.

Every record ends when its request leaves the queue: selected (`selected`), aborted or
retracted (`forget`), or gone by a path no hook saw (`sweep`), so an idle server keeps none
(/server_info `radixflow.records`). The traversal's hash chains are a cache aged by scans,
not a record.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from radixflow_sglang.core.admission import Followers
from radixflow_sglang.core.stats import RequestStats
from radixflow_sglang.core.traversal import Traversal

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

    from .boundary import BoundaryPublisher
    from .queueindex import QueueIndex

SWEEP_SLACK = 1024  # records past twice the queue that start a whole sweep


class Records:
    """Per-request records: the runtime's `requests` (RequestStats) and fragment deferrals,
    the traversal's wait set and wait history, the boundary publisher's keys, the admission
    hold's burst heads (core/admission.py `Followers`)."""

    def __init__(self, traversal: Traversal | None, boundary: BoundaryPublisher,
                 clock: Callable[[], float], followers: Followers | None = None) -> None:
        self.followers = followers  # the admission hold's bursts (their heads' rids)
        self.requests: dict[str, RequestStats] = {}
        self.frag_deferred: dict[str, int] = {}  # rid -> DEFER `fragment` decisions so far
        self.traversal, self.boundary, self.clock = traversal, boundary, clock
        self._seq = 0  # registration order
        self.passes = 0  # scheduler passes so far (`RadixFlowRuntime.hold` counts them)

    def register(self, req: Req, round_: int, stamp: float) -> None:
        """A request seen in the queue gets its record (once)."""
        if req.rid not in self.requests:
            self._seq += 1
            self.requests[req.rid] = RequestStats(req.rid, self.clock(), seq=self._seq,
                                                  registered_round=round_, stamp=stamp,
                                                  arrival=self.passes)

    def forget(self, rid: str) -> None:
        """The request left the queue without being selected (aborted, retracted, or gone by a
        path no hook saw, `sweep`): drop every record of it, here, in the traversal (wait set,
        wait history, hash chain) and in the boundary publisher."""
        self.selected(rid)
        if self.traversal is not None:
            self.traversal.forget(rid)

    def selected(self, rid: str) -> RequestStats | None:
        """`rid` left the queue selected (or, via `forget`, not): drop the records that only a
        queued request reads (its fragment deferrals, wait history, the boundary publisher's
        keys and slot deferrals); its RequestStats, returned. Its hash chain stays: in flight
        it is a producer next scan (`TokenChains.tick` ages it out)."""
        rs = self.requests.pop(rid, None)
        self.frag_deferred.pop(rid, None)
        self.boundary.forget(rid)
        if self.followers is not None:
            self.followers.selected(rid)  # NOTE: a head's followers count until the next pass
        if self.traversal is not None:
            self.traversal.waits.forget(rid)
        return rs

    def sweep(self, queue: QueueIndex, whole: bool = False) -> None:
        """Forget the requests that left the queue with no hook seeing them go (SGLang's aborts
        call `forget` at once, adapter/scheduler.py `_release_aborted_request`; selection
        `selected`): every parked one (a stale wait-set entry would keep every later scan off
        its quiet path), and every recorded one once the records outgrow the queue (or
        `whole`). `queue`: the scan's queue index (adapter/queueindex.py)."""
        waits = self.traversal.waits if self.traversal is not None else None
        if whole or self.count() > 2 * len(queue) + SWEEP_SLACK:
            rids = [*self.requests, *self.frag_deferred, *waits.total_rounds] if waits else [
                *self.requests, *self.frag_deferred]
        elif waits is not None and len(waits):
            rids = waits.rids()
        else:
            return
        live = queue.rids
        for rid in [rid for rid in rids if rid not in live]:
            self.forget(rid)

    def count(self) -> int:
        """The records the sweep can drop (the boundary publisher's aside: it lists no rids).
        NOTE: `counts`' sum without its boundary count, a set union the sweep asked each scan."""
        t = self.traversal
        return (len(self.requests) + len(self.frag_deferred)
                + (len(t.waits.total_rounds) if t is not None else 0))

    def counts(self) -> dict[str, int]:
        """Per-request records kept now, by owner (/server_info `radixflow.records`): an idle
        server reads all zeros."""
        t = self.traversal
        return {"requests": len(self.requests), "frag_deferred": len(self.frag_deferred),
                "wait_set": len(t.waits) if t is not None else 0,
                "wait_history": len(t.waits.total_rounds) if t is not None else 0,
                "boundary": self.boundary.records(),
                "bursts": self.followers.open() if self.followers is not None else 0}

    def parked(self) -> list[str]:
        """Requests in the wait set now."""
        return self.traversal.waits.rids() if self.traversal is not None else []

    def parked_rounds(self) -> Mapping[str, int]:
        """Rounds each request has parked so far, kept until it leaves the queue (read-only)."""
        waits = self.traversal.waits.total_rounds if self.traversal is not None else {}
        return MappingProxyType(waits)
