"""Where scheduled prefill tokens go beyond the oracle: one twin replay, attributed (issue 12).

The oracle computes every shared prefix once: visiting requests in the order the scheduler
first selected them (ties: request id), request R could reuse

    ideal(R) = min(max lcp(R, E) over earlier requests E of its namespace, len(R) - 1)

(SGLang matches at most len - 1 tokens), so its first prefill needs len(R) - ideal(R) tokens;
their sum is the size of the namespace's token trie, eval/twin.py's unique tokens (L_cap's U).
What a replay schedules beyond it splits exactly into

* `grid`: ideal(R) - floor(ideal(R) / G) * G. A hybrid model keeps recurrent states only at
  multiples of the checkpoint grid G, so no scheduler reuses a fork point off the grid;
* `same_round`: the request's best earlier sharer was first selected in the same scan, and it
  recomputed the shared prefix beside it (the cost rule chose recomputing, or it was never
  Blocked: θ, nothing published in reach). Stock recomputes every sibling this way;
* `later_short`: its best sharer ran in an earlier scan, yet its ready prefix fell short of
  the grid floor (state published elsewhere or evicted, a chunk boundary off the grid, a
  parked request released by its bound). Negative when a request reused more than the grid
  floor (a state exactly at an aligned fork);
* `reprefill`: lives after a retraction (eval/twin.py `reprefill_tokens`).

scheduled = unique + grid + same_round + later_short + reprefill, exactly (`check`).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any

from eval.twin import lcp
from eval.workload import Segment

CAUSES = ("grid", "same_round", "later_short", "reprefill")


def _best_earlier(seen: list[list[int]], at: dict[int, float], ids: list[int]
                  ) -> tuple[int, float | None]:
    """(longest common prefix of `ids` with any earlier request, when that one was selected).
    In lexicographic order the longest lcp with a set is with a neighbour of the insertion
    point; of two neighbours sharing as much, the earlier selected counts."""
    i = bisect.bisect_left(seen, ids)
    best, when = 0, None
    for j in (i - 1, i):
        if 0 <= j < len(seen):
            n = lcp(ids, seen[j])
            t = at[id(seen[j])]
            if n > best or (n == best and n and when is not None and t < when):
                best, when = n, t
    return best, when


def breakdown(segments: Sequence[Segment], result: Any, grid: int) -> dict[str, int]:
    """Tokens `result` (an eval.twin ArmResult, `requests` kept) scheduled, split as in the
    module docstring. Segments share no namespace (eval/twin.py), so namespaces suffice."""
    ids: dict[str, list[int]] = {}
    ns: dict[str, str] = {}
    for seg in segments:
        for q in seg.questions:
            for b in q.branches:
                ids[b.rid] = list(b.input_ids)
                ns[b.rid] = b.namespace
    reqs = result.requests
    out = dict.fromkeys(("scheduled", "unique", *CAUSES), 0)
    seen: dict[str, list[list[int]]] = {}
    at: dict[int, float] = {}  # id(ids list) -> its first selection
    for rid in sorted(reqs, key=lambda r: (reqs[r].first_selection_s, r)):
        b = reqs[rid]
        mine = ids[rid]
        sorted_ids = seen.setdefault(ns[rid], [])
        best, when = _best_earlier(sorted_ids, at, mine)
        bisect.insort(sorted_ids, mine)
        at[id(mine)] = b.first_selection_s
        ideal = min(best, b.input_len - 1)
        floor = ideal // grid * grid
        out["unique"] += b.input_len - ideal
        out["grid"] += ideal - floor
        cause = "same_round" if when == b.first_selection_s else "later_short"
        out[cause] += floor - b.chunks[0][0]
        out["reprefill"] += sum(t - ch[0][0] for t, ch in b.life_chunks()[1:])
        out["scheduled"] += sum(e for _, e in b.chunks)
    return out


def check(parts: dict[str, int]) -> bool:
    """The split is exact: its parts add up to the scheduled tokens."""
    return parts["scheduled"] == parts["unique"] + sum(parts[c] for c in CAUSES)
