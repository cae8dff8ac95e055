"""Where a producer publishes state, following SGLang 0.5.23's own rules.

Ported from `ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend` (extra_buffer),
`MambaComponent.prepare_for_caching_req` (no_buffer: the extend end) and the full-attention
radix cache (every page). Depths are absolute token counts from the sequence start.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Layout(StrEnum):
    EXTRA_BUFFER = "extra_buffer"  # one tracked state per extend, on the grid or a branch point
    NO_BUFFER = "no_buffer"  # the state at the extend end only
    FULL = "full"  # full attention: KV of every page is reusable


@dataclass(frozen=True)
class Grid:
    layout: Layout
    size: int  # mamba checkpoint grid G, or the page size for full attention

    def planned_depth(self, prefix: int, extend: int, branching: int | None = None) -> int | None:
        """Depth the producer will publish after this extend; None when it publishes nothing."""
        if extend <= 0:
            return None
        if self.layout is Layout.FULL:
            return (prefix + extend) // self.size * self.size
        if self.layout is Layout.NO_BUFFER:
            return prefix + extend
        if extend < self.size:  # NOTE: SGLang tracks no state for an extend shorter than G
            return None
        if branching is not None and self.branch_ok(prefix, extend, branching):
            return branching
        return prefix + extend // self.size * self.size

    def branch_ok(self, prefix: int, extend: int, depth: int) -> bool:
        """Whether an extra_buffer producer can be told to publish at `depth` instead."""
        return prefix < depth <= prefix + extend and (depth - prefix) % self.size == 0

    def fork_depth(self, prefix: int, extend: int, reach: int) -> int | None:
        """Deepest depth <= reach this producer could publish at; None if there is none."""
        if reach <= prefix:
            return None
        if self.layout is Layout.FULL:
            return min(reach, prefix + extend) // self.size * self.size
        if self.layout is Layout.NO_BUFFER:
            return min(reach, prefix + extend)  # as a chunk end
        d = prefix + (min(reach, prefix + extend) - prefix) // self.size * self.size
        return d if d > prefix else None
