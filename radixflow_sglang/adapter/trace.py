"""Trace: the runtime's decision trace, one JSON event a line (--radixflow-trace).

Block-buffered and flushed once per scan and per forward (`flush`): a line-buffered trace
made a write per event, ~100 per no_buffer burst scan, exposed on the live loop. Encoded with
orjson (SGLang's own dependency): `json.dumps` cost ~10 us an event, 170-240 us a queue-16
scan, which every traced live arm paid and stock did not. Standard JSON: a non-finite number
(an unknown age, `older_by`; an unknown period, NaN) is written as null, where `json.dumps`
wrote `Infinity` (and callers converted NaN themselves).
"""

from __future__ import annotations

from typing import IO, TYPE_CHECKING

import orjson

from radixflow_sglang.core.grid import Grid

from .reqs import cache_hit

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import Req

TRACE_BUFFER = 1 << 16  # bytes of trace events held between flushes (a burst scan's ~15 KB)
# NOTE: an enum as its value, a non-str key (a depth) as its text, numpy numbers as numbers,
# anything else as str()
_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_APPEND_NEWLINE


class Trace:
    """Events to `path` (None: tracing off, `on` False and every call a no-op)."""

    def __init__(self, path: str | None) -> None:
        self.file: IO[bytes] | None = (
            open(path, "ab", buffering=TRACE_BUFFER) if path else None)  # noqa: SIM115
        self.dp_rank: int | None = None  # set in a DP server: its ranks append to one trace

    @property
    def on(self) -> bool:
        """Tracing: callers build an event only then (building one is not free)."""
        return self.file is not None

    def emit(self, record: dict) -> None:
        if self.file is not None:
            if self.dp_rank is not None:
                record = {"dp_rank": self.dp_rank, **record}
            self.file.write(orjson.dumps(record, default=str, option=_OPTIONS))

    def flush(self) -> None:
        """The events so far to the file (a reader sees whole scans and forwards)."""
        if self.file is not None:
            self.file.flush()

    def admitted(self, round_: int, req: Req, grid: Grid) -> None:
        """A request native admission took: the depth it resumes from (its ready prefix, the
        part of it a cache hit), its extend and where it publishes its state as planned now
        (a consumer's fork may still move it: the consumer's `parked` event)."""
        extend = req.extend_end - req.prefix_len
        self.emit({"event": "admitted", "round": round_, "rid": req.rid,
                   "prefix": req.prefix_len, "hit": cache_hit(req), "extend": extend,
                   "publish": grid.planned_depth(req.prefix_len, extend,
                                                 req.mamba_branching_seqlen)})
