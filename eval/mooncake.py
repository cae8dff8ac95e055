"""Trace replay (issue 36): a Mooncake-format trace as one Segment of one-branch Questions.

A Mooncake trace (kvcache-ai/Mooncake FAST'25 `traces/*.jsonl`; ../shared/data/DATA.md) has one
JSON object a line: `timestamp` (ms), `input_length`, `output_length` and `hash_ids`, the ids of
the request's 512-token prefix blocks (equal ids: a shareable block). It carries no text, so a
replay maps each hash id to one fixed block of BLOCK token ids (`block`: seeded by the id, the
same id the same block; its first id is `LO + id % SPAN`, so blocks of ids that differ
modulo SPAN never share a first token, and requests share exactly the blocks the trace says
they share); a request's prompt is its blocks, the last one cut to `input_length`.

Each request becomes a Question of one Branch: arrival (timestamp - the window's first) / 1000 /
speed seconds, max_new_tokens = min(output_length, max_output), ignore_eos (the twin's and the
client's default), one cache namespace (one server). `window` (START, N) takes N records from
the START-th (0-based, file order) before the caps; records over `max_input` input tokens are
then left out and counted (`describe`). With `rate` (eval.sweep's ladder) the arrivals are
scaled to that mean offered rate (requests/s) instead of by `speed`.

SGLang's bench_serving reads the same file (`--dataset-name mooncake --dataset-path FILE
--use-trace-timestamps`, `--mooncake-slowdown-factor`: 1/speed), but builds text prompts of
its own from the ids ("{id} hi hi ..."), so its blocks are not these ids.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from eval.jsonl import DataError
from eval.jsonl import read_jsonl as _read_jsonl
from eval.requests import SYNTHETIC_ID_RANGE, Branch, Question, Segment
from radixflow_sglang import models

NAME = "trace"
BLOCK = 512  # tokens per hash id (Mooncake's block size)
LO, HI = SYNTHETIC_ID_RANGE
SPAN = HI - LO
DEFAULT_MAX_INPUT = 30_000
DEFAULT_MAX_OUTPUT = 256


@dataclass(frozen=True)
class TraceRecord:
    line: int  # 1-based line in the file (errors and rids name it)
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


@dataclass(frozen=True)
class TraceSpec:
    """What to replay of a trace file (the CLI's --trace-* flags)."""

    file: str
    speed: float = 1.0
    start: int = 0
    count: int | None = None  # None: to the end of the file
    max_input: int = DEFAULT_MAX_INPUT
    max_output: int = DEFAULT_MAX_OUTPUT
    rate: float | None = None  # requests/s over the window (eval.sweep); None: use speed

    def __post_init__(self) -> None:
        checks = [("--trace-speed", self.speed, 0.0, False),
                  ("--trace-max-input", self.max_input, 1, True),
                  ("--trace-max-output", self.max_output, 0, True)]
        for flag, v, lo, integral in checks:
            if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v < math.inf \
                    or (integral and not isinstance(v, int)) or (not integral and v <= lo):
                kind = "an integer >= " if integral else "a finite number > "
                raise ValueError(f"{flag} must be {kind}{lo}, got {v!r}")
        if self.start < 0 or (self.count is not None and self.count < 1):
            raise ValueError(f"--trace-window must be START:N with START >= 0 and N >= 1, got "
                             f"{self.start}:{self.count}")
        if self.max_input + self.max_output > models.CONTEXT_LENGTH:
            raise ValueError(f"--trace-max-input + --trace-max-output = "
                             f"{self.max_input + self.max_output}, over the context length "
                             f"{models.CONTEXT_LENGTH}")


def parse_window(text: str) -> tuple[int, int | None]:
    """"START:N" (N records from the START-th, 0-based) or "START:" (to the end)."""
    head, sep, tail = text.partition(":")
    try:
        start = int(head)
        count = int(tail) if tail.strip() else None
    except ValueError:
        start, count = -1, None
    if not sep or start < 0 or (count is not None and count < 1):
        raise ValueError(f"--trace-window must be START:N (START >= 0, N >= 1) or START:, got "
                         f"{text!r}")
    return start, count


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


def _int(row: dict[str, Any], key: str, lo: int, where: str) -> int:
    v = row.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        raise DataError(f"{where}: field {key!r} must be an integer >= {lo}, got {v!r:.80}")
    return v


def parse_record(row: dict[str, Any], where: str, line: int) -> TraceRecord:
    ts = row.get("timestamp")
    if isinstance(ts, bool) or not isinstance(ts, int | float) or not 0 <= ts < math.inf:
        raise DataError(f"{where}: field 'timestamp' must be a number >= 0 (ms), got {ts!r:.80}")
    n_in = _int(row, "input_length", 1, where)
    n_out = _int(row, "output_length", 0, where)
    ids = row.get("hash_ids")
    if not isinstance(ids, list) or not all(
            isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in ids):
        raise DataError(f"{where}: field 'hash_ids' must be a list of integers >= 0, got "
                        f"{ids!r:.80}")
    if len(ids) != math.ceil(n_in / BLOCK):
        raise DataError(f"{where}: {len(ids)} hash_ids for input_length {n_in}; expected "
                        f"ceil({n_in} / {BLOCK}) = {math.ceil(n_in / BLOCK)}")
    return TraceRecord(line, float(ts), n_in, n_out, tuple(ids))


def load_trace(path: str | Path) -> list[TraceRecord]:
    """Every record of a Mooncake-format file in file order; a bad record is a DataError naming
    the file and its line."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"--trace-file: no such file {file}")
    out = [parse_record(row, f"{file} line {n}", n) for n, row in _read_jsonl(file)]
    for a, b in zip(out, out[1:], strict=False):
        if b.timestamp_ms < a.timestamp_ms:
            raise DataError(f"{file} line {b.line}: timestamp {b.timestamp_ms:g} ms is earlier "
                            f"than line {a.line}'s {a.timestamp_ms:g} ms (the trace must be in "
                            f"arrival order)")
    if not out:
        raise DataError(f"{file}: no records")
    return out


# --------------------------------------------------------------------------------------------
# Blocks and prompts
# --------------------------------------------------------------------------------------------


def block(hash_id: int) -> list[int]:
    """The BLOCK token ids of a hash id: fixed (seeded by the id), first id LO + id % SPAN."""
    rest = np.random.default_rng([hash_id, 36]).integers(LO, HI, BLOCK - 1)
    return [LO + hash_id % SPAN, *rest.tolist()]


class Blocks:
    """`block` with a cache: a trace reuses its blocks, and their int objects are then shared."""

    def __init__(self) -> None:
        self._cache: dict[int, list[int]] = {}

    def __call__(self, hash_id: int) -> list[int]:
        b = self._cache.get(hash_id)
        if b is None:
            b = self._cache[hash_id] = block(hash_id)
        return b

    def prompt(self, rec: TraceRecord) -> list[int]:
        ids: list[int] = []
        for h in rec.hash_ids:
            ids += self(h)
        del ids[rec.input_length:]
        return ids


# --------------------------------------------------------------------------------------------
# Selection and the segment
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    records: tuple[TraceRecord, ...]  # kept, in file order
    window: int  # records in the window
    over_input: int  # left out: input_length > max_input
    capped_output: int  # kept records whose output was capped


def select(spec: TraceSpec, records: Sequence[TraceRecord] | None = None) -> Selection:
    recs = load_trace(spec.file) if records is None else records
    if spec.start >= len(recs):
        raise ValueError(f"--trace-window starts at record {spec.start}, but {spec.file} has "
                         f"{len(recs)}")
    end = len(recs) if spec.count is None else spec.start + spec.count
    window = recs[spec.start:end]
    kept = tuple(r for r in window if r.input_length <= spec.max_input)
    if not kept:
        raise ValueError(f"--trace-max-input {spec.max_input}: every one of the window's "
                         f"{len(window)} records is longer")
    return Selection(kept, len(window), len(window) - len(kept),
                     sum(r.output_length > spec.max_output for r in kept))


def arrivals(spec: TraceSpec, kept: Sequence[TraceRecord]) -> list[float]:
    """Seconds from the window's first kept record: / 1000 / speed, or scaled to `rate`."""
    t0 = kept[0].timestamp_ms
    raw = [(r.timestamp_ms - t0) / 1000.0 for r in kept]
    if spec.rate is None:
        return [t / spec.speed for t in raw]
    if math.isinf(spec.rate) or raw[-1] <= 0:
        return [0.0] * len(raw) if math.isinf(spec.rate) else raw
    scale = (len(raw) - 1) / spec.rate / raw[-1]
    return [t * scale for t in raw]


def namespace(spec: TraceSpec) -> str:
    return f"{NAME}/{Path(spec.file).stem}/{spec.start}"


def segments(spec: TraceSpec, model: str) -> list[Segment]:
    """The trace as one Segment (regime "trace", order "replay")."""
    from eval.requests import model_key

    model_key(model)  # NOTE: ids lie in SYNTHETIC_ID_RANGE, valid for every catalog model
    sel = select(spec)
    ns, blocks = namespace(spec), Blocks()
    qs = [_question(r, t, ns, blocks, spec.max_output)
          for r, t in zip(sel.records, arrivals(spec, sel.records), strict=True)]
    return [Segment(NAME, "replay", tuple(qs))]


def _question(rec: TraceRecord, t: float, ns: str, blocks: Blocks, max_output: int) -> Question:
    qid = f"l{rec.line}"
    branch = Branch(f"{ns}/{qid}", blocks.prompt(rec), ns, 0,
                    max_new_tokens=min(rec.output_length, max_output))
    return Question(qid, qid, (branch,), 0, 0, None, t, f"trace line {rec.line}")


def describe(spec: TraceSpec) -> dict[str, Any]:
    """What was replayed, for summary.json: the spec and the selection's counts."""
    sel = select(spec)
    span = arrivals(spec, sel.records)[-1]
    return {"workload": NAME, "file": str(spec.file), "speed": spec.speed,
            "window": f"{spec.start}:{'' if spec.count is None else spec.count}",
            "max_input": spec.max_input, "max_output": spec.max_output,
            "rate": spec.rate if spec.rate is None or math.isfinite(spec.rate) else "inf",
            "window_records": sel.window, "requests": len(sel.records),
            "left_out_over_max_input": sel.over_input, "outputs_capped": sel.capped_output,
            "input_tokens": sum(r.input_length for r in sel.records), "span_s": span,
            "unique_blocks": len(unique_blocks(sel.records))}


def unique_blocks(records: Iterable[TraceRecord]) -> set[int]:
    return {h for r in records for h in r.hash_ids}


# --------------------------------------------------------------------------------------------
# bench_serving's own prompts (eval/bench_arm.py `mooncake`)
# --------------------------------------------------------------------------------------------

BENCH_NAME = "trace-bench"


def bench_prompt(rec: TraceRecord, tokenizer: Any) -> list[int]:
    """The ids the server sees for `rec` under `bench_serving --dataset-name mooncake`
    (sglang 0.5.23 sglang/benchmark/datasets/mooncake.py get_mooncake_request_over_time, one
    round): "{id}" + "hi" x 128 per hash id, a closing request, in the tokenizer's chat
    template (plain "user: ..." without one), sent as text and tokenized by the server."""
    base = "".join(f"{h}" + " ".join(["hi"] * 128) for h in rec.hash_ids)
    chat = [{"role": "user", "content": f"Round 1: {base}Tell me a story based on this context."}]
    try:
        text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True,
                                             return_dict=False)
    except Exception:  # noqa: BLE001 - bench_serving's own fallback, the same text
        text = "\n".join(f"{m['role']}: {m['content']}" for m in chat)
    return list(tokenizer.encode(text))


def bench_segments(spec: TraceSpec, tokenizer: Any) -> list[Segment]:
    """The twin's replay of bench_serving's mooncake run: the file's first `spec.count`
    records (bench_serving reads no window start and no input cap), its prompts
    (`bench_prompt`), arrivals (timestamp - first) / 1000 / speed in timestamp order, outputs
    uncapped (bench_serving sends output_length with ignore_eos)."""
    if spec.start:
        raise ValueError(f"{spec.file}: bench_serving reads the first records; window start "
                         f"{spec.start} is not 0")
    recs = sorted(load_trace(spec.file)[: spec.count], key=lambda r: r.timestamp_ms)
    t0, ns = recs[0].timestamp_ms, f"{BENCH_NAME}/{Path(spec.file).stem}"
    qs = []
    for r in recs:
        qid = f"l{r.line}"
        branch = Branch(f"{ns}/{qid}", bench_prompt(r, tokenizer), ns, 0,
                        max_new_tokens=r.output_length)
        qs.append(Question(qid, qid, (branch,), 0, 0, None,
                           (r.timestamp_ms - t0) / 1000.0 / spec.speed, f"trace line {r.line}"))
    return [Segment(BENCH_NAME, "replay", tuple(qs))]
