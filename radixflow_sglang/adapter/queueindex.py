"""One scan's waiting queue, indexed once (issue 50).

`RadixFlowRuntime.begin_scan` builds one `QueueIndex` from SGLang's waiting queue in its visit
order (after the ORDER point) and the scan's readers share it: the cost rules' view
(adapter/scanview.py `ScanView`), the boundary publisher's scan (adapter/boundary_scan.py
`BoundaryScan`), the record sweep, the arrival count and the quiet rule. The scan never changes
the queue (SGLang drops the selected requests after it), so one index serves them all. What
not every scan needs is built on first use. A leaf: it imports nothing of ours but the Req
accessors.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING

from .reqs import req_len

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req


class QueueIndex:
    """The waiting queue as the scan began (rank-identical) and its indexes: `queue` (its
    requests, in order) and `rids` (theirs); on first use `pos` (rid -> position), `lens`
    (input lengths), `after` (input-length suffix sums) and `demand` (extend prefix sums)."""

    __slots__ = ("queue", "rids", "_pos", "_lens", "_after", "_demand")

    def __init__(self, queue: Iterable[Req] = ()) -> None:
        self.queue: list = list(queue)
        self.rids: set[str] = {r.rid for r in self.queue}
        self._pos: dict[str, int] | None = None
        self._lens: list[int] | None = None
        self._after: list[int] | None = None
        self._demand: list[int] | None = None

    def __len__(self) -> int:
        return len(self.queue)

    @property
    def pos(self) -> dict[str, int]:
        """rid -> queue position."""
        if self._pos is None:
            self._pos = {r.rid: i for i, r in enumerate(self.queue)}
        return self._pos

    @property
    def lens(self) -> list[int]:
        """Each entry's input length (`req_len`: fixed while it waits)."""
        if self._lens is None:
            self._lens = [req_len(r) for r in self.queue]
        return self._lens

    @property
    def after(self) -> list[int]:
        """after[i]: input tokens of queue entries i.. (an upper bound of the demand)."""
        if self._after is None:
            lens = self.lens
            after = [0] * (len(lens) + 1)
            for i in range(len(lens) - 1, -1, -1):
                after[i] = after[i + 1] + lens[i]
            self._after = after
        return self._after

    @property
    def demand(self) -> list[int]:
        """demand[i]: input lengths less ready prefixes of queue entries ..i-1. NOTE: the
        prefixes as they are at the first call: the scan matches each request it visits
        (`init_next_round_input`), so the entries it passed read their match by then."""
        if self._demand is None:
            self._demand = list(itertools.accumulate(
                (n - r.prefix_len for n, r in zip(self.lens, self.queue, strict=True)),
                initial=0))
        return self._demand
