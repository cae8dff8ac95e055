"""What the boundary publisher knows of one scan's queue (issue 15; adapter/boundary.py).

`BoundaryScan` holds one scan's facts: the waiting queue as the scan began (rank-identical: the
scan's queue index, adapter/queueindex.py, with its positions and demand prefix sums), the
indexes built over it on first use (sibling groups per depth, sharers of a first grid step)
and what this scan's selections did (selected, served, cut, decided).
`BoundaryPublisher.begin_scan` builds a fresh one, so nothing is reset by hand. `PrefixKeys`
(the prefix hashes of queued requests) lives across scans: a request is hashed once while it
waits. A leaf: it imports nothing of ours but the pure core, the Req accessors and the queue
index.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Iterator, KeysView
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from radixflow_sglang.core.producers import as_tokens, common_prefix
from radixflow_sglang.core.reasons import Reason

from .queueindex import QueueIndex
from .reqs import namespace, req_tokens

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

    from radixflow_sglang.core.boundary import Marker

SHARERS = 32  # NOTE: queued sharers a placement reads (a bound on a scan's LCP work)


def prefix_key(ns, tokens, depth: int) -> tuple:
    """The key of `tokens[:depth]` in namespace `ns`: (ns, depth, hash)."""
    # NOTE: the prefix's int64 bytes, hashed in C (a tuple of an array's ints cost ~50 ns per
    # token: most of a selected request's boundary bookkeeping); one encoding for every type
    return (ns, depth, hash(as_tokens(tokens[:depth]).tobytes()))


class PrefixKeys:
    """rid -> depth -> prefix key, across scans (a queued request is hashed once per depth)."""

    def __init__(self) -> None:
        self._by_rid: dict[str, dict[int, tuple]] = {}

    def of(self, req: Req, tokens, ns, depth: int) -> tuple:
        keys = self._by_rid.setdefault(req.rid, {})
        k = keys.get(depth)
        if k is None:
            k = keys[depth] = prefix_key(ns, tokens, depth)
        return k

    def get(self, rid: str, depth: int) -> tuple | None:
        """`rid`'s key at `depth` if already hashed, else None."""
        keys = self._by_rid.get(rid)
        return None if keys is None else keys.get(depth)

    def forget(self, rid: str) -> None:
        self._by_rid.pop(rid, None)

    def keep_only(self, live: set[str]) -> None:
        self._by_rid = {k: v for k, v in self._by_rid.items() if k in live}

    def rids(self) -> KeysView[str]:
        return self._by_rid.keys()

    def __contains__(self, rid: object) -> bool:
        return rid in self._by_rid

    def __len__(self) -> int:
        return len(self._by_rid)


@dataclass(frozen=True)
class Placement:
    """The last selected request's boundary decision: the PLACE rule, the PUBLISH rule (None
    when nothing was placed), the depth published (None: SGLang's own) and its no_buffer mark."""

    placed: Reason
    how: Reason | None
    depth: int | None
    mark: int | None


@dataclass(eq=False)
class BoundaryScan:
    """One scan's queue and what its selections did. `number`: the publisher's scan count;
    `index`: the scan's queue index (the runtime's, shared with its ScanView); `keys`: the
    prefix keys kept across scans; `step`: the grid size."""

    number: int = 0
    index: QueueIndex = field(default_factory=QueueIndex)  # the waiting queue (rank-identical)
    keys: PrefixKeys = field(default_factory=PrefixKeys)
    step: int = 1
    groups: dict[int, dict[tuple, int]] = field(default_factory=dict)  # depth -> key -> queued
    heads: dict[tuple, list] | None = None  # key at one grid step -> queued requests
    slot_keys: dict[tuple, None] = field(default_factory=dict)  # deferred for the slot, in order
    serving: set[tuple] = field(default_factory=set)  # keys published at their boundary
    selected: set[str] = field(default_factory=set)  # rids selected
    fork_marks: dict[str, tuple[int, Marker]] = field(default_factory=dict)  # rid -> (d, marker)
    cut: Req | None = None  # the request cut at its boundary
    decided: Placement | None = None  # the last `admitted` call's rules (the trace)
    queue: list = field(init=False)  # the index's requests, in order
    rids: set[str] = field(init=False)  # the index's rids

    def __post_init__(self) -> None:
        self.queue, self.rids = self.index.queue, self.index.rids

    def groups_at(self, depth: int) -> dict[tuple, int]:
        """This scan's queued requests per key (namespace, depth, prefix hash) at `depth`."""
        g = self.groups.get(depth)
        if g is None:
            g = {}
            for r in self.queue:
                toks = req_tokens(r)
                if len(toks) > depth and r.prefix_len < depth:
                    k = self.keys.of(r, toks, namespace(r), depth)
                    g[k] = g.get(k, 0) + 1
            self.groups[depth] = g
        return g

    def queued_past(self, req: Req, ns, depth: int) -> bool:
        """An unselected queued request shares `req`'s tokens past `depth`: its fork, deeper,
        is known demand the traversal publishes for; a depth learned from other paths is a
        guess and must not take the one state from it (a 2,000-token document's siblings
        found only the 1,152 learned from shorter documents and recomputed the rest)."""
        tokens = req_tokens(req)
        d = depth + self.step
        if d >= len(tokens):
            return False
        key = self.keys.of(req, tokens, ns, d)
        n = self.groups_at(d).get(key, 0) - (1 if req.rid in self.rids else 0)
        return n > 0

    def between(self, req: Req, r: Req) -> int | None:
        """The demand (input lengths less ready prefixes: an upper bound) queued after `req` up
        to and including `r`; None when `r` comes before it (the scan has passed it). NOTE:
        the ready prefixes as they are at the scan's first call (`QueueIndex.demand`)."""
        cum, pos = self.index.demand, self.index.pos
        i, j = pos.get(req.rid, -1), pos.get(r.rid)
        return None if j is None or j < i else cum[j + 1] - cum[i + 1]

    def sharers(self, req: Req, tokens, ns) -> list[Req]:
        """The queued requests not selected this scan that share `req`'s first grid step, at
        most SHARERS, in queue order (rank-identical); `overlap` gives each one's match."""
        if len(tokens) <= self.step:
            return []
        return list(itertools.islice(self.head_sharers(req, tokens, ns), SHARERS))

    @staticmethod
    def overlap(r: Req, mine: array) -> int:
        """The prefix queued request `r` can match of tokens `mine` (array('q')). NOTE: asked
        only for a sharer the round cannot reach (`PlacementTargets.queued`): each costs a
        token compare of the whole shared prefix (~7 us on a 2,000-token document)."""
        t = req_tokens(r)
        # NOTE: a request matches at most its length - 1 (SGLang keeps one token to run)
        return min(common_prefix(as_tokens(t), mine), len(t) - 1)

    def head_sharers(self, req: Req, tokens, ns) -> Iterator[Req]:
        """The queued requests, not `req` and not selected this scan, longer than one grid
        step and sharing `req`'s first one (its namespace included), in queue order: one
        index per scan instead of a pass over the queue per request."""
        g = self.step
        if self.heads is None:
            self.heads = {}
            for r in self.queue:
                t = req_tokens(r)
                if len(t) > g:
                    self.heads.setdefault(self.keys.of(r, t, namespace(r), g), []).append(r)
        return (r for r in self.heads.get(self.keys.of(req, tokens, ns, g), ())
                if r is not req and r.rid not in self.selected)

    def sibling_depths(self, req: Req, tokens, ns, low: int) -> list[int]:
        """Common prefix with each queued request (not selected) that shares `low` tokens."""
        # NOTE: sharing `low` >= one grid step, it shares the first: `head_sharers` has it
        pool = (self.head_sharers(req, tokens, ns) if low >= self.step else
                (r for r in self.queue if r is not req and r.rid not in self.selected))
        head = tokens[:low]
        out = []
        for r in pool:
            t = req_tokens(r)
            if len(t) > low and namespace(r) == ns and t[:low] == head:
                out.append(common_prefix(t, tokens))
        return out
