"""Where a producer publishes state, following SGLang 0.5.23's own rules.

Ported from `ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend` (extra_buffer),
`MambaComponent.prepare_for_caching_req` (no_buffer: the extend end) and the full-attention
radix cache (every page). Depths are absolute token counts from the sequence start.

Pages (page_size > 1): the tree names only page-aligned depths, and SGLang cuts chunks on
pages. So a mamba checkpoint grid is lcm(model chunk, page) (`mamba_checkpoint_grid`,
runtime_context.py) and must be a multiple of the page; a no_buffer cut (a chunk end) lands on a
page (SGLang itself allows no_buffer only at page 1); full attention publishes whole pages.
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
    size: int  # mamba checkpoint grid G (lcm with the page), or the page size for full attention
    page: int = 1  # KV page size: chunk ends and tree depths are multiples of it

    def __post_init__(self) -> None:
        if self.size < 1 or self.page < 1:
            raise ValueError(f"Grid: size {self.size} and page {self.page} must be >= 1")
        if self.layout is Layout.FULL and self.page not in (1, self.size):
            raise ValueError(f"Grid: full attention publishes pages: size {self.size} is the "
                             f"page, not {self.page}")
        if self.layout is not Layout.FULL and self.size % self.page:
            raise ValueError(f"Grid: checkpoint grid {self.size} is not a multiple of the page "
                             f"{self.page} (SGLang uses lcm(chunk, page))")

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
            d = min(reach, prefix + extend) // self.page * self.page  # a chunk end: on a page
            return d if d > prefix else None
        d = prefix + (min(reach, prefix + extend) - prefix) // self.size * self.size
        return d if d > prefix else None
