"""Replay client: the four-branch workload against any SGLang-compatible HTTP server.

Like the paper's client: questions are offered at their trace time (`arrival_s`, Poisson at
the workload's rate) and submitted through a finite pool of at most `pool` concurrent
questions (default 64). A question waits for a free slot, so `send - offered` (the sender lag)
grows when the server falls behind. Its four branches then go out together, each as one
`/generate` request

    {"input_ids": ..., "sampling_params": {"max_new_tokens": 1, "temperature": 0,
     "ignore_eos": true}, "rid": <branch rid>, "extra_key": <cache namespace>}

(SGLang 0.5.23's GenerateReqInput accepts `extra_key` and folds it into the radix key, so
branches of different namespaces never share cache entries). `ForkSender` sends a question as
an SGLang frontend program instead (shared prefix, `s.fork(4)`, `sgl.gen(max_tokens=1)`).

Traffic beyond the paper's shape (eval/traffic.py) goes through the same replay:

* each branch asks for its own `max_new_tokens` (0: a prefill-only request);
* a question with `after` is offered `arrival_s` seconds after that question completed (its
  last branch's response), a closed loop, whatever the server's pace;
* a question that continues a one-branch question with a scripted output (its input starts
  with that question's input + output: the next turn of a multi-turn conversation) is sent
  with the ACTUAL input and output ids of that question instead (a live model's output is not
  the script), followed by its own new ids (`continuation`);
* `GenerateSender(n_param=True)` sends a question of identical branches as ONE request with
  SGLang's sampling parameter `n` (the tokenizer manager then sends its own max_new_tokens=0
  warm request, waits for it and fans out n copies); `fold_warm` removes the workload's
  scripted warm question (nsample warm), since SGLang sends it itself; the folded question's
  latency then covers the warm request too (the twin counts the warm question and the samples
  as two questions). Without it (the default) the branches go out as n separate requests, as
  RL rollout frameworks send them.

Per question: offered time, send time, each branch's completion time and generated token(s).

    latency          = send -> completion of its last branch
    offered latency  = offered -> completion of its last branch
    sender lag       = send - offered

Segments are replayed in sequence (as the twin does): the next segment starts, with its own
offered times, once every question of the previous one has completed.

All times are `time.monotonic()` (CLOCK_MONOTONIC, system-wide on Linux), the clock of the
server's `--radixflow-trace` events, so the two line up without conversion.

`summarize()` turns the per-branch records (the raw JSONL) plus, when available, the server's
trace into the twin's summary metrics (eval/twin.py METRIC_KEYS):

* hit_tokens = sum of SGLang's `meta_info.cached_tokens` (the prefix at first selection: the
  twin's definition), input_tokens = sum of `meta_info.prompt_tokens`, for every arm.
* With a trace (RadixFlow's scheduler): rounds, scheduled_tokens, rows/round, tokens/round,
  blocked, parked_max_rounds and first selection come from the trace's events inside the
  replay's time windows (server warm-up and health checks fall outside them).
* Without one (SGLang's own scheduler class writes none): scheduled_tokens = prompt - cached
  per request; rounds, rows/round, tokens/round, blocked, parked and first selection are
  null (unknown), never taken from another run.
"""

from __future__ import annotations

import dataclasses
import heapq
import json
import math
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from eval.workload import Branch, Question, Segment

SAMPLING = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}
DEFAULT_POOL = 64
REQUEST_TIMEOUT_S = 600.0


# --------------------------------------------------------------------------------------------
# Records
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """Where a question sits in the replay and when it was offered and sent."""

    segment: int
    segment_name: str
    regime: str
    offered_s: float
    q_send_s: float


@dataclass
class BranchRecord:
    """One branch request: a line of the raw JSONL."""

    segment: int
    segment_name: str
    regime: str
    qid: str
    rid: str  # the workload's branch rid (the key across arms)
    option: int
    namespace: str
    input_len: int  # workload input ids
    offered_s: float
    q_send_s: float  # when the question got its pool slot
    send_s: float = math.nan  # when this branch's request went out
    done_s: float | None = None  # when its response arrived
    server_rid: str | None = None  # meta_info.id (what the server's trace calls it)
    output_ids: list[int] | None = None
    text: str | None = None
    prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None
    max_new_tokens: int = 1
    after: str | None = None  # the question whose completion released this one

    @classmethod
    def open(cls, q: Question, b: Branch, slot: Slot) -> BranchRecord:
        return cls(slot.segment, slot.segment_name, slot.regime, q.qid, b.rid, b.option,
                   b.namespace, len(b.input_ids), slot.offered_s, slot.q_send_s,
                   max_new_tokens=b.max_new_tokens, after=q.after)

    def fill(self, out: Mapping[str, Any]) -> None:
        """Take what a /generate response (or a frontend meta_info) says."""
        meta = out.get("meta_info", out)
        self.server_rid = meta.get("id")
        self.prompt_tokens = meta.get("prompt_tokens")
        self.cached_tokens = meta.get("cached_tokens")
        ids = out.get("output_ids")
        self.output_ids = list(ids) if ids is not None else None
        self.text = out.get("text")


class Sender(Protocol):
    def send(self, q: Question, slot: Slot) -> list[BranchRecord]: ...

    def close(self) -> None: ...


# --------------------------------------------------------------------------------------------
# Senders
# --------------------------------------------------------------------------------------------


def post_json(url: str, body: Mapping[str, Any], timeout: float = REQUEST_TIMEOUT_S) -> Any:
    """POST JSON, return the decoded answer; an HTTP error raises with the server's text."""
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        text = e.read().decode(errors="replace")[:500]
        raise RuntimeError(f"HTTP {e.code} from {url}: {text}") from None


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"[:1000]


class GenerateSender:
    """One concurrent `/generate` request per branch (input ids, rid, extra_key, the branch's
    max_new_tokens); with `n_param`, one request with SGLang's `n` for a question of identical
    branches (module docstring)."""

    def __init__(self, base_url: str, *, pool: int = DEFAULT_POOL, namespace_prefix: str = "",
                 rid_prefix: str = "", extra_key: bool = True,
                 timeout: float = REQUEST_TIMEOUT_S, n_param: bool = False,
                 width: int = 16) -> None:
        self.url = base_url.rstrip("/") + "/generate"
        self.namespace_prefix = namespace_prefix
        self.rid_prefix = rid_prefix
        self.extra_key = extra_key
        self.timeout = timeout
        self.n_param = n_param
        # NOTE: threads start lazily; `width` branches per question go out at once (nsample n)
        self._branches = ThreadPoolExecutor(width * pool, thread_name_prefix="branch")

    def body(self, b: Branch) -> dict[str, Any]:
        sampling = dict(SAMPLING, max_new_tokens=b.max_new_tokens)
        if b.boundary is not None:  # NOTE: the declared boundary (adapter/boundary.py FIELD)
            sampling["custom_params"] = {"radixflow_boundary": b.boundary}
        body: dict[str, Any] = {"input_ids": list(b.input_ids), "sampling_params": sampling,
                                "rid": self.rid_prefix + b.rid}
        ns = self.namespace_prefix + b.namespace
        if self.extra_key and ns:
            body["extra_key"] = ns
        return body

    def _one(self, q: Question, b: Branch, slot: Slot) -> BranchRecord:
        rec = BranchRecord.open(q, b, slot)
        body = self.body(b)
        rec.send_s = time.monotonic()
        try:
            out = post_json(self.url, body, self.timeout)
            rec.done_s = time.monotonic()
            rec.fill(out)
        except Exception as e:  # noqa: BLE001 - recorded, never filled in
            rec.done_s = time.monotonic()
            rec.error = _error_text(e)
        return rec

    def n_body(self, q: Question) -> dict[str, Any]:
        """One request for every branch: SGLang's `n` (its tokenizer manager regenerates the
        rids, so none is sent; meta_info.id names each sample)."""
        body = self.body(q.branches[0])
        del body["rid"]
        body["sampling_params"]["n"] = len(q.branches)
        return body

    def _n_request(self, q: Question, slot: Slot) -> list[BranchRecord]:
        recs = [BranchRecord.open(q, b, slot) for b in q.branches]
        body = self.n_body(q)
        t = time.monotonic()
        for r in recs:
            r.send_s = t
        try:
            out = post_json(self.url, body, self.timeout)
            done = time.monotonic()
            if not isinstance(out, list) or len(out) != len(recs):
                raise RuntimeError(f"expected {len(recs)} outputs for n={len(recs)}, got "
                                   f"{type(out).__name__} of {len(out) if out else 0}")
            for r, o in zip(recs, out, strict=True):
                r.fill(o)
                r.done_s = done
        except Exception as e:  # noqa: BLE001 - recorded, never filled in
            now = time.monotonic()
            for r in recs:
                r.done_s, r.error = now, _error_text(e)
        return recs

    def send(self, q: Question, slot: Slot) -> list[BranchRecord]:
        if self.n_param and identical_branches(q):
            return self._n_request(q, slot)
        if len(q.branches) == 1:  # NOTE: no thread hop: a burst of one-branch questions goes out
            return [self._one(q, q.branches[0], slot)]  # as fast as the question pool starts
        futs = [self._branches.submit(self._one, q, b, slot) for b in q.branches]
        return [f.result() for f in futs]

    def close(self) -> None:
        self._branches.shutdown(wait=True)


def identical_branches(q: Question) -> bool:
    """Two or more branches with the same ids, namespace and max_new_tokens (n samples)."""
    b0 = q.branches[0]
    return len(q.branches) > 1 and all(
        b.input_ids == b0.input_ids and b.namespace == b0.namespace
        and b.max_new_tokens == b0.max_new_tokens for b in q.branches[1:])


def fold_warm(segments: Sequence[Segment]) -> list[Segment]:
    """For `GenerateSender(n_param=True)`: a warm question (every branch max_new_tokens=0)
    whose dependents are all n-sample questions of its prompt is dropped, and they take its
    arrival (its `arrival_s` and `after`): SGLang's tokenizer manager sends the warm request
    itself, inside the one request with `n`. Other questions are kept as they are."""
    out = []
    for seg in segments:
        deps: dict[str, list[Question]] = {}
        for q in seg.questions:
            if q.after is not None:
                deps.setdefault(q.after, []).append(q)

        warm = {q.qid: q for q in seg.questions if _folds(q, deps.get(q.qid, []))}
        qs = [dataclasses.replace(q, arrival_s=warm[q.after].arrival_s + q.arrival_s,
                                  after=warm[q.after].after)
              if q.after in warm else q for q in seg.questions if q.qid not in warm]
        out.append(dataclasses.replace(seg, questions=tuple(qs)))
    return out


def _folds(w: Question, kids: Sequence[Question]) -> bool:
    return (bool(kids) and all(b.max_new_tokens == 0 for b in w.branches)
            and all(identical_branches(k) and k.branches[0].input_ids == w.branches[0].input_ids
                    for k in kids))


def continuation(q: Question, parent: Question, sent_parent: Question,
                 parent_recs: Sequence[BranchRecord]) -> Question:
    """`q` as sent after `parent` completed: a branch whose ids start with the parent's ids +
    its scripted output (a one-branch parent: the previous turn) starts instead with the ids
    the parent was actually sent with + the ids it actually generated (module docstring)."""
    if len(parent.branches) != 1 or not parent.branches[0].output:
        return q
    pb = parent.branches[0]
    head = [*pb.input_ids, *pb.output]
    rec = parent_recs[0]
    branches = []
    for b in q.branches:
        if b.input_ids[:len(head)] == head:
            if rec.output_ids is None:
                raise RuntimeError(f"{q.qid} continues {parent.qid}, whose response carried no "
                                   f"output_ids")
            ids = [*sent_parent.branches[0].input_ids, *rec.output_ids, *b.input_ids[len(head):]]
            b = dataclasses.replace(b, input_ids=ids)
        branches.append(b)
    return dataclasses.replace(q, branches=tuple(branches))


def split_text(q: Question, decode: Callable[[Sequence[int]], str],
               namespace_prefix: str = "") -> tuple[str, list[str]]:
    """(shared prefix text, per-branch rest) decoded from the workload's ids.

    The frontend sends text; the server re-tokenizes it, so the ids it computes can differ
    from the workload's (BPE may merge across the piece boundary; random synthetic ids do not
    round-trip at all). `prompt_tokens` in the records says what the server saw.

    The frontend cannot send `extra_key`, so the cache namespace is emulated in the text: the
    prompt starts with a tag line "[namespace]" (none for an empty namespace). Prompts of
    different namespaces then differ from their first tokens on and share no cache entry, as
    with `extra_key`; without it the regimes' namespaces (and the segments, which replay the
    same documents) would share everything.
    """
    p = q.prefix_len
    ns = namespace_prefix + q.namespace
    tag = f"[{ns}]\n" if ns else ""
    prefix = tag + decode(q.branches[0].input_ids[:p])
    return prefix, [decode(b.input_ids[p:]) for b in q.branches]


def _fork_program():
    import sglang as sgl

    @sgl.function
    def four_branches(s, prefix, rests):
        s += prefix
        forks = s.fork(len(rests))
        for f, rest in zip(forks, rests, strict=True):
            f += rest + sgl.gen("v", max_tokens=1, temperature=0, ignore_eos=True)
        # NOTE: waited in order, so a branch's time is max(its completion, earlier ones'); the
        # last one (the question's completion) is exact.
        s["done"] = [(f["v"], f.get_meta_info("v"), time.monotonic()) for f in forks]

    return four_branches


class ForkSender:
    """A question as an SGLang frontend program: prefix, `s.fork(4)`, `sgl.gen(max_tokens=1)`.

    The frontend cannot set `rid` or `extra_key`: its requests carry server-chosen ids
    (meta_info.id, recorded as server_rid) and the namespace is a tag line at the start of the
    prompt (`split_text`). Completion times are taken when the program observes each fork's
    result.
    """

    def __init__(self, base_url: str, decode: Callable[[Sequence[int]], str], *,
                 namespace_prefix: str = "") -> None:
        import sglang as sgl

        self.backend = sgl.RuntimeEndpoint(base_url)
        self.decode = decode
        self.namespace_prefix = namespace_prefix
        self.program = _fork_program()

    def send(self, q: Question, slot: Slot) -> list[BranchRecord]:
        recs = [BranchRecord.open(q, b, slot) for b in q.branches]
        prefix, rests = split_text(q, self.decode, self.namespace_prefix)
        t = time.monotonic()
        for r in recs:
            r.send_s = t
        try:
            state = self.program.run(prefix=prefix, rests=rests, backend=self.backend)
            err = state.error() if hasattr(state, "error") else None
            if err:
                raise RuntimeError(str(err))
            for r, (text, meta, done) in zip(recs, state["done"], strict=True):
                r.fill({"meta_info": meta or {}, "text": text})
                r.done_s = done
        except Exception as e:  # noqa: BLE001 - recorded, never filled in
            now = time.monotonic()
            for r in recs:
                if r.done_s is None:
                    r.done_s, r.error = now, _error_text(e)
        return recs

    def close(self) -> None:
        pass


# --------------------------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------------------------


@dataclass
class ReplayResult:
    records: list[BranchRecord]
    wall_s: float


def _failed_question(q: Question, slot: Slot, error: str) -> list[BranchRecord]:
    recs = [BranchRecord.open(q, b, slot) for b in q.branches]
    for r in recs:
        r.done_s, r.error = time.monotonic(), error
    return recs


def _run_question(sender: Sender, q: Question, si: int, seg: Segment,
                  offered: float) -> list[BranchRecord]:
    slot = Slot(si, seg.name, seg.regime, offered, time.monotonic())
    try:
        return sender.send(q, slot)
    except Exception as e:  # noqa: BLE001 - a sender bug fails the question, visibly
        return _failed_question(q, slot, _error_text(e))


def check_after(seg: Segment) -> None:
    """Every `after` names a question earlier in the segment's send order."""
    seen: set[str] = set()
    for q in seg.questions:
        if q.after is not None and q.after not in seen:
            raise ValueError(f"segment {seg.name}: question {q.qid} is after {q.after!r}, "
                             f"which is not an earlier question of the segment")
        seen.add(q.qid)


class _SegmentRun:
    """One segment's questions offered at their times: roots at start + arrival_s, a question
    with `after` at its parent's completion + arrival_s (module docstring)."""

    def __init__(self, ex: ThreadPoolExecutor, sender: Sender, si: int, seg: Segment,
                 tick: Callable[[Future], None]) -> None:
        check_after(seg)
        self.ex, self.sender, self.si, self.seg, self.tick = ex, sender, si, seg, tick
        self.qs = list(seg.questions)
        self.index = {q.qid: i for i, q in enumerate(self.qs)}
        self.kids: dict[str, list[int]] = {}
        for i, q in enumerate(self.qs):
            if q.after is not None:
                self.kids.setdefault(q.after, []).append(i)
        self.cond = threading.Condition()
        self.ready: list[tuple[float, int]] = []  # (offered, send-order index): a stable heap
        self.sent: dict[int, Question] = {}
        self.results: dict[int, list[BranchRecord]] = {}

    def run(self) -> list[BranchRecord]:
        start = time.monotonic()
        self.ready = [(start + q.arrival_s, i) for i, q in enumerate(self.qs) if q.after is None]
        heapq.heapify(self.ready)
        futs = []
        for _ in self.qs:
            offered, i = self._next()
            fut = self.ex.submit(self._work, i, offered)
            fut.add_done_callback(self.tick)
            futs.append(fut)
        for f in futs:
            f.result()
        return [r for i in range(len(self.qs)) for r in self.results[i]]

    def _next(self) -> tuple[float, int]:
        with self.cond:
            while True:
                if self.ready and self.ready[0][0] <= time.monotonic():
                    return heapq.heappop(self.ready)
                timeout = self.ready[0][0] - time.monotonic() if self.ready else None
                self.cond.wait(timeout)

    def _work(self, i: int, offered: float) -> list[BranchRecord]:
        try:
            recs = self._send(i, offered)
        except Exception as e:  # noqa: BLE001 - never leave its dependents waiting
            slot = Slot(self.si, self.seg.name, self.seg.regime, offered, time.monotonic())
            recs = _failed_question(self.qs[i], slot, _error_text(e))
        done = max(r.done_s for r in recs if r.done_s is not None)
        with self.cond:
            self.results[i] = recs
            for k in self.kids.get(self.qs[i].qid, []):
                heapq.heappush(self.ready, (done + self.qs[k].arrival_s, k))
            self.cond.notify()
        return recs

    def _send(self, i: int, offered: float) -> list[BranchRecord]:
        q = self.qs[i]
        try:
            if q.after is not None:
                p = self.index[q.after]
                prec = self.results[p]
                bad = [r for r in prec if r.error]
                if bad:
                    raise RuntimeError(f"not sent: {q.after} failed ({bad[0].error})")
                q = continuation(q, self.qs[p], self.sent[p], prec)
        except Exception as e:  # noqa: BLE001 - the question fails, visibly, and is not sent
            slot = Slot(self.si, self.seg.name, self.seg.regime, offered, time.monotonic())
            recs = _failed_question(q, slot, _error_text(e))
        else:
            self.sent[i] = q
            recs = _run_question(self.sender, q, self.si, self.seg, offered)
        return recs


def _prestart(ex: ThreadPoolExecutor, n: int) -> None:
    """Start the pool's n threads before the first arrival (they start lazily otherwise, one
    per submit, which spreads a burst over the thread start-ups on a busy machine)."""
    barrier = threading.Barrier(n)
    for f in [ex.submit(barrier.wait) for _ in range(n)]:
        f.result()


def replay(segments: Sequence[Segment], sender: Sender, *, pool: int = DEFAULT_POOL,
           raw_path: str | Path | None = None, progress: bool = True,
           desc: str = "replay") -> ReplayResult:
    """Offer every segment's questions at their times through a pool of `pool` questions."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    total = sum(len(s) for s in segments)
    bar = tqdm(total=total, desc=desc, unit="q", disable=not progress, leave=False)
    lock = threading.Lock()

    def tick(_f: Future) -> None:
        with lock:
            bar.update(1)

    records: list[BranchRecord] = []
    raw = open(raw_path, "w", encoding="utf-8") if raw_path else None  # noqa: SIM115
    try:
        with ThreadPoolExecutor(pool, thread_name_prefix="question") as ex:
            _prestart(ex, pool)
            for si, seg in enumerate(segments):
                seg_recs = _SegmentRun(ex, sender, si, seg, tick).run()
                records += seg_recs
                if raw is not None:
                    for r in seg_recs:
                        raw.write(json.dumps(asdict(r)) + "\n")
                    raw.flush()
    finally:
        bar.close()
        if raw is not None:
            raw.close()
    return ReplayResult(records, time.perf_counter() - t0)


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a JSONL file; a torn last line (a killed writer) is dropped, others raise."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    out = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            if n == len(lines):
                break
            raise ValueError(f"{path} line {n}: malformed JSON") from None
    return out


def load_trace(path: str | Path) -> list[dict[str, Any]] | None:
    """A server's --radixflow-trace events, or None when the file does not exist."""
    p = Path(path)
    return read_jsonl(p) if p.exists() else None


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class QuestionTiming:
    segment: int
    qid: str
    offered_s: float
    send_s: float
    completion_s: float

    @property
    def latency_s(self) -> float:
        return self.completion_s - self.send_s

    @property
    def offered_latency_s(self) -> float:
        return self.completion_s - self.offered_s

    @property
    def sender_lag_s(self) -> float:
        return self.send_s - self.offered_s


def questions(rows: Iterable[Mapping[str, Any]]) -> list[QuestionTiming]:
    """One timing per question (segment, qid); its completion is its last branch's."""
    by_q: dict[tuple[int, str], list[Mapping[str, Any]]] = {}
    for r in rows:
        by_q.setdefault((r["segment"], r["qid"]), []).append(r)
    out = []
    for (seg, qid), brs in by_q.items():
        out.append(QuestionTiming(seg, qid, brs[0]["offered_s"], brs[0]["q_send_s"],
                                  max(b["done_s"] for b in brs)))
    return out


def failed(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in rows if r.get("error") or r.get("done_s") is None]


def _pct(xs: np.ndarray, p: float) -> float | None:
    return float(np.percentile(xs, p)) if xs.size else None


def _mean(xs: Sequence[float]) -> float | None:
    return float(np.mean(xs)) if len(xs) else None


def _latency_stats(prefix: str, xs: np.ndarray) -> dict[str, float | None]:
    return {f"{prefix}_mean_s": float(xs.mean()) if xs.size else None,
            f"{prefix}_p50_s": _pct(xs, 50), f"{prefix}_p95_s": _pct(xs, 95),
            f"{prefix}_p99_s": _pct(xs, 99)}


def rounds_in(trace: Sequence[Mapping[str, Any]],
              spans: Sequence[tuple[float, float]]) -> list[Mapping[str, Any]]:
    """The trace's "round" events whose scan started inside one of the spans."""
    return [e for e in trace if e.get("event") == "round"
            and any(a <= e["t_start"] <= b for a, b in spans)]


def _span(rows: Sequence[Mapping[str, Any]]) -> tuple[float, float]:
    return min(r["q_send_s"] for r in rows), max(r["done_s"] for r in rows)


def _spans(rows: Sequence[Mapping[str, Any]]) -> list[tuple[float, float]]:
    by_seg: dict[int, list[Mapping[str, Any]]] = {}
    for r in rows:
        by_seg.setdefault(r["segment"], []).append(r)
    return [_span(v) for v in by_seg.values()]


def _trace_counters(rows: Sequence[Mapping[str, Any]],
                    trace: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    launched = [e for e in rounds_in(trace, _spans(rows)) if e["rows"] > 0]
    every = rounds_in(trace, _spans(rows))
    n = len(launched)
    sched = sum(e["scheduled_tokens"] for e in launched)
    send = {r["server_rid"]: r["send_s"] for r in rows if r.get("server_rid")}
    sel = [e for e in trace if e.get("event") == "selected" and e.get("rid") in send]
    firsts = [e["first_selected"] - send[e["rid"]] for e in sel
              if e.get("first_selected") is not None]
    return {
        "rounds": n,
        "scheduled_tokens": sched,
        "rows_per_round": sum(e["rows"] for e in launched) / n if n else 0.0,
        "tokens_per_round": sched / n if n else 0.0,
        "blocked": sum(e.get("blocked", 0) for e in every),
        "parked_max_rounds": max((e.get("rounds_parked", 0) for e in sel), default=0),
        "first_selection_mean_s": _mean(firsts),
        "first_selection_matched": len(firsts),
        "trace_round_hit_tokens": sum(e["hit_tokens"] for e in launched),
        "held_rounds": sum(1 for e in every if e.get("held", 0) > 0),
    }


UNKNOWN_WITHOUT_TRACE = ("rounds", "rows_per_round", "tokens_per_round", "blocked",
                         "parked_max_rounds", "first_selection_mean_s")
# NOTE: the twin's decode keys a non-streaming client cannot see (the trace logs prefill rounds)
UNKNOWN_LIVE = ("decode_steps", "decode_s", "ttft_mean_s", "ttft_p95_s", "retractions",
                "reprefill_tokens")


def core_metrics(rows: Sequence[Mapping[str, Any]],
                 trace: Sequence[Mapping[str, Any]] | None) -> dict[str, Any]:
    """The twin's metric keys for a set of completed branch records (see module docstring)."""
    qs = questions(rows)
    lat = np.array([q.latency_s for q in qs], dtype=float)
    off = np.array([q.offered_latency_s for q in qs], dtype=float)
    lag = np.array([q.sender_lag_s for q in qs], dtype=float)
    per_req = np.array([r["done_s"] - r["q_send_s"] for r in rows], dtype=float)
    inp = sum(r["prompt_tokens"] if r.get("prompt_tokens") is not None else r["input_len"]
              for r in rows)
    hit = sum(r.get("cached_tokens") or 0 for r in rows)
    m: dict[str, Any] = {
        "questions": len(qs), "requests": len(rows), "input_tokens": inp, "hit_tokens": hit,
        "reuse": hit / inp if inp else 0.0, "scheduled_tokens_meta": inp - hit,
        # NOTE: issue 15's count: requests that reused nothing, all and those released `after`
        # another question (gsp-paced's siblings, later turns, n samples after a warm request)
        "zero_hit_requests": sum(1 for r in rows if not r.get("cached_tokens")),
        "zero_hit_after_requests": sum(1 for r in rows if r.get("after")
                                       and not r.get("cached_tokens")),
        "after_requests": sum(1 for r in rows if r.get("after")),
        "output_tokens": sum(len(r.get("output_ids") or ()) for r in rows),
        **_latency_stats("request_latency", per_req), **{k: None for k in UNKNOWN_LIVE},
        **_latency_stats("latency", lat), **_latency_stats("offered_latency", off),
        "sender_lag_mean_s": float(lag.mean()) if lag.size else None,
        "sender_lag_max_s": float(lag.max()) if lag.size else None,
        "makespan_s": (max(q.completion_s for q in qs) - min(q.offered_s for q in qs)
                       if qs else None),
    }
    if trace is None:
        m.update({k: None for k in UNKNOWN_WITHOUT_TRACE})
        m["scheduled_tokens"] = inp - hit
        m["counters"] = "meta_info (no server trace)"
        m["tokens_conserved"] = None
    else:
        m.update(_trace_counters(rows, trace))
        m["counters"] = "radixflow trace"
        # The twin's conservation: scheduled + hit == input (chunks included, no recompute).
        m["tokens_conserved"] = m["scheduled_tokens"] == inp - hit
    return m


def summarize(rows: Sequence[Mapping[str, Any]], trace: Sequence[Mapping[str, Any]] | None,
              *, leaks: Mapping[str, int | None] | None = None,
              l_caps: Mapping[str, int] | None = None,
              budgets: Mapping[str, int | None] | None = None) -> dict[str, Any]:
    """Summary metrics of one arm (twin keys + live extras), with per_segment / per_regime.

    Raises ValueError if any record failed: a failed request is never filled in, so an arm
    with one has no numbers (the caller records the error instead).
    """
    bad = failed(rows)
    if bad:
        raise ValueError(f"{len(bad)} of {len(rows)} requests failed, first: "
                         f"{bad[0]['rid']}: {bad[0].get('error')}")
    m = core_metrics(rows, trace)
    segs: dict[str, list[Mapping[str, Any]]] = {}
    regimes: dict[str, list[Mapping[str, Any]]] = {}
    for r in rows:
        segs.setdefault(r["segment_name"], []).append(r)
        regimes.setdefault(r["regime"], []).append(r)
    l_caps = l_caps or {}
    m["per_segment"] = {n: _with_cap(core_metrics(v, trace), l_caps.get(n))
                        for n, v in segs.items()}
    reg_cap = {reg: _sum_caps(l_caps, {r["segment_name"] for r in v})
               for reg, v in regimes.items()}
    m["per_regime"] = {reg: _with_cap(core_metrics(v, trace), reg_cap[reg])
                       for reg, v in regimes.items()}
    _with_cap(m, _sum_caps(l_caps, set(segs)))
    leaks = leaks or {}
    m["leaked_kv_slots"] = leaks.get("kv")
    m["leaked_mamba_slots"] = leaks.get("mamba")
    m["row_budget"] = (budgets or {}).get("rows")
    m["token_budget"] = (budgets or {}).get("tokens")
    m["busy_s"] = None  # forward durations are not in the trace (see eval/calibrate.py)
    return m


def _sum_caps(l_caps: Mapping[str, int], names: set[str]) -> int | None:
    if not names or any(n not in l_caps for n in names):
        return None
    return sum(l_caps[n] for n in names)


def _with_cap(m: dict[str, Any], l_cap: int | None) -> dict[str, Any]:
    m["l_cap"] = l_cap
    m["rounds_over_l_cap"] = m["rounds"] / l_cap if l_cap and m["rounds"] is not None else None
    return m


__all__ = [
    "BranchRecord", "ForkSender", "GenerateSender", "QuestionTiming", "ReplayResult", "Slot",
    "check_after", "continuation", "core_metrics", "failed", "fold_warm", "identical_branches",
    "load_trace", "post_json", "questions", "read_jsonl", "replay", "rounds_in", "split_text",
    "summarize",
]
