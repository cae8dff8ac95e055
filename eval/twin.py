"""Scheduler twin: the paper's workload through SGLang's real scheduling code, in virtual time.

The scheduler is the real one (`radixflow_sglang.testing.kit.Kit`: SGLang 0.5.23's pools,
UnifiedRadixCache, Req and prefill scan, stock or ours); only the GPU is simulated. A batch
takes `cost(batch)` seconds of GPU time (`eval/costmodel.py`); with a host-cost model
(`eval/hostcost.py`, the default of eval/replay.py) the scheduler's own CPU time per round
takes virtual time too, and the cost model's host part moves off the GPU (no double count).

Protocol
--------
The clock, the pipeline of in-flight batches, completions and the idle guard are the shared
virtual-time loop's (`radixflow_sglang/testing/loop.py`, whose docstring has the timeline).
In short:

* A question's four branches arrive together at its `arrival_s` and are appended to the
  kit's waiting queue at once, in branch order, each with the question's namespace as
  `extra_key` (so branches of different namespaces never share cache entries). A question
  with `after` arrives `arrival_s` after question `after` (same segment, earlier in send
  order) completed: a closed loop.
* Each branch generates `max_new_tokens` ids (its scripted `output`, else a filler id): the
  kit runs SGLang's real running batch, so a step is a prefill batch when one forms, else one
  decode step of the running batch (`DecodeRound`), which takes `cost.decode` GPU time
  (eval/costmodel.py, "Decode steps"); with a host model a decode step is charged its own
  scan's host time (eval/hostcost.py `HostCost.decode`, no prefill batch preparation).
  `max_new_tokens=0` is SGLang's prefill-only request. The paper's branches generate one
  token: no decode step at all.
* The clock `now` is the time of the scheduler's next scan. A launched batch occupies the GPU
  for [start, end) with start = max(now + host, end of the previous batch); without overlap
  the step processes it (now -> its end), under overlap the previous one (the scan of batch
  N+1 runs while batch N computes, hiding its host time, as SGLang's overlap loop does).
* A branch completes at the end of the batch that computed its last token; its first token
  (TTFT) is at the end of its last prefill chunk. A question's latency is arrival ->
  completion of its last branch.
* An admission hold sleeps in virtual time (to its deadline or the next arrival); a scan that
  does nothing costs an idle tick.
* Segments are replayed IN SEQUENCE on one kit (one server, as the GPU benchmark does): the
  next segment's arrival times are offset to the instant the previous one has fully drained.
  Their namespaces carry the segment tag, so segments share no cache hits, but they do share
  the pools (entries of earlier segments are evicted by LRU as space is needed). Per-segment
  and per-regime numbers are therefore clean: no two segments overlap in time.

Capacity bound L_cap
--------------------
The fewest rounds ANY scheduler with budgets (S rows, T tokens per round) could use on the
workload, ignoring arrival times and cache capacity. Per segment s with R_s requests:

    U_s   = sum over namespaces of the size of the token trie of that namespace's requests,
            where each request also counts at least one token (SGLang matches at most
            len - 1 tokens, so a duplicate still computes one): the tokens that must be
            computed at least once if every shared prefix were computed exactly once
    L_cap = sum over segments of max(ceil(U_s / T), ceil(R_s / S))

Every request needs a row in at least one round and every unique token is computed in some
round; segments never share a round (each drains before the next starts), hence the sum.
The grid of hybrid models (states only at multiples of G) can only add tokens, so this stays
a lower bound. `rounds / L_cap` >= 1 measures how far a policy is from perfectly full rounds.

Latency decomposition vs stock ("Eq. 2 style": our own, exact by construction)
------------------------------------------------------------------------------
For an arm, N = mean over questions of the rounds it waited through (rounds whose end lies in
(arrival, completion]) and C = L / N with L its mean latency: the effective cost of one waited
round (it includes partial rounds and idle gaps, by definition L = N * C exactly). Then

    L_arm - L_stock = (N_arm - N_stock) * C_stock      "round credit" (fewer rounds waited)
                    + (C_arm - C_stock) * N_arm        "cost shift"   (each round costs more/less)

The same split is given for total GPU busy time (rounds * mean round cost). Negative = faster.

Conservation checks (raise ConservationError): every branch completes exactly once, every
request's chunks are contiguous (prefix_{i+1} = prefix_i + extend_i) and end at its input
length, and the tokens scheduled over all rounds equal sum over requests of
(input_len - prefix at first selection); `hit_tokens` is that sum of first-selection prefixes,
so scheduled_tokens + hit_tokens == input_tokens. Retraction (SGLang's `retract_decode` under
KV pressure) starts a request's new life: it re-prefills from whatever the cache then holds to
its input plus the ids it had generated, each life contiguous on its own. Those tokens are
scheduled prefill work too: `reprefill_tokens` counts them, and then
scheduled_tokens - reprefill_tokens + hit_tokens == input_tokens.
Decode steps are not rounds: `rounds`, `scheduled_tokens`, `busy_s` and the decomposition
below count prefill rounds; `decode_steps` and `decode_s` the decode steps.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from eval.costmodel import CostModel, attn_pairs, default_cost
from eval.workload import Question, Segment

METRIC_KEYS = (
    "requests", "rounds", "scheduled_tokens", "hit_tokens", "input_tokens", "reuse",
    "rows_per_round", "tokens_per_round", "latency_mean_s", "latency_p50_s", "latency_p95_s",
    "latency_p99_s", "sender_lag_mean_s", "first_selection_mean_s", "blocked",
    "parked_max_rounds", "leaked_kv_slots", "leaked_mamba_slots", "decode_steps", "decode_s",
    "ttft_mean_s", "ttft_p95_s", "request_latency_mean_s", "request_latency_p95_s",
    "retractions", "reprefill_tokens", "output_tokens", "zero_hit_requests",
    "zero_hit_after_requests", "after_requests",
)


class ConservationError(AssertionError):
    """The replay broke an accounting invariant (see module docstring)."""


@dataclass
class RoundRecord:
    index: int
    segment: int
    scan_s: float  # when the scan that formed it ran
    start_s: float
    end_s: float
    rows: int
    tokens: int
    hit_tokens: int  # the rows' cache hits (a continued chunk's own earlier chunks excluded)
    attn_pairs: float
    host_s: float = 0.0  # scheduler CPU time charged before it (0: free scans)
    mode: str = "prefill"  # or "decode" (ArmResult.decode_rounds)
    cached_tokens: int = 0  # decode: KV entries its attention reads

    @property
    def cost_s(self) -> float:
        return self.end_s - self.start_s


@dataclass
class QuestionRecord:
    qid: str
    segment: int
    arrival_s: float  # absolute virtual time
    completion_s: float = math.nan
    rounds_waited: int = 0
    after: bool = False  # released by another question's completion (a follower)

    @property
    def latency_s(self) -> float:
        return self.completion_s - self.arrival_s


@dataclass
class _Branch:
    rid: str
    question: int  # index into the question records
    input_len: int
    arrival_s: float
    first_selection_s: float | None = None
    chunks: list[tuple[int, int]] = field(default_factory=list)  # (prefix, extend) per round
    last_round: int = -1
    completion_s: float | None = None
    first_token_s: float | None = None
    outputs: int = 0  # ids generated
    lives: list[tuple[int, int]] = field(default_factory=list)  # retraction: (chunk i, target)

    def target(self) -> int:
        """The length its current life's prefill ends at."""
        return self.lives[-1][1] if self.lives else self.input_len

    def computed(self) -> int:
        """What its current life has prefilled so far: its own work, not a cache hit."""
        start = self.lives[-1][0] if self.lives else 0
        return sum(self.chunks[-1]) if len(self.chunks) > start else 0

    def life_chunks(self) -> list[tuple[int, list[tuple[int, int]]]]:
        """(target, chunks) per life: before any retraction, then one per retraction."""
        cuts = [(0, self.input_len), *self.lives]
        ends = [c for c, _ in cuts[1:]] + [len(self.chunks)]
        return [(t, self.chunks[c:e]) for (c, t), e in zip(cuts, ends, strict=True)]


@dataclass
class SegmentInfo:
    name: str
    regime: str
    order: str
    start_s: float
    end_s: float
    questions: int
    l_cap: int
    unique_tokens: int
    blocked: int = 0


@dataclass
class ArmResult:
    policy: str
    model: str
    layout: str
    overlap: bool
    seed: int
    metrics: dict[str, Any] | None = None
    error: str | None = None
    rounds: list[RoundRecord] = field(default_factory=list)  # prefill rounds
    decode_rounds: list[RoundRecord] = field(default_factory=list)  # decode steps
    questions: list[QuestionRecord] = field(default_factory=list)
    segments: list[SegmentInfo] = field(default_factory=list)
    cost: CostModel | None = None
    wall_s: float = 0.0
    requests: dict[str, _Branch] = field(default_factory=dict)  # rid -> its chunks and lives
    outputs: dict[str, tuple[int, ...]] = field(default_factory=dict)  # rid -> generated ids
    # NOTE: decisions by the rule that made them, every point (core/reasons.py; none for stock)
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def round_rows(self) -> list[int]:
        return [r.rows for r in self.rounds]

    @property
    def round_tokens(self) -> list[int]:
        return [r.tokens for r in self.rounds]

    @property
    def latencies(self) -> list[float]:
        return [q.latency_s for q in self.questions]

    def segment_metrics(self) -> dict[str, dict[str, Any]]:
        return (self.metrics or {}).get("per_segment", {})

    def regime_metrics(self) -> dict[str, dict[str, Any]]:
        return (self.metrics or {}).get("per_regime", {})


# --------------------------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------------------------


def as_segments(questions_or_segments: Segment | Iterable[Segment | Question]) -> list[Segment]:
    """A Segment, a list of Segments, or a list of Questions (one segment "custom")."""
    if isinstance(questions_or_segments, Segment):
        return [questions_or_segments]
    items = list(questions_or_segments)
    if all(isinstance(x, Segment) for x in items):
        return items
    if all(isinstance(x, Question) for x in items):
        return [Segment("custom", "forward", tuple(items))]
    raise TypeError("expected Segments or Questions, not a mix")


def lcp(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x, y = np.asarray(a[:n]), np.asarray(b[:n])
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


def unique_tokens(questions: Iterable[Question]) -> int:
    """Token-trie size per namespace, each request counting at least one token (see L_cap)."""
    by_ns: dict[str, list[list[int]]] = {}
    for q in questions:
        for b in q.branches:
            by_ns.setdefault(b.namespace, []).append(b.input_ids)
    total = 0
    for seqs in by_ns.values():
        seqs = sorted(seqs)
        prev: Sequence[int] = ()
        for s in seqs:
            total += max(1, len(s) - lcp(prev, s))
            prev = s
    return total


def capacity_bound(segment: Segment, rows: int, tokens: int) -> tuple[int, int]:
    """(L_cap of one segment, its unique tokens U)."""
    u = unique_tokens(segment.questions)
    n = sum(len(q.branches) for q in segment.questions)
    return max(math.ceil(u / tokens), math.ceil(n / rows)), u


# --------------------------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------------------------


def replay(
    questions_or_segments: Segment | Iterable[Segment | Question],
    model: str,
    policy: str,
    *,
    layout: str = "extra_buffer",
    overlap: bool = False,
    cost: CostModel | None = None,
    seed: int = 0,
    progress: bool = False,
    kit_overrides: dict[str, Any] | None = None,
    radixflow_config: Any = None,
    host: Any = None,
    on_forward: Callable[[int, int, float], None] | None = None,
    gpu: Callable[[Any], float] | None = None,
    ignore_eos: bool = True,
    executor: str = "witness",
    release_lag_s: float = 0.0,
    branch_spread_s: float = 0.0,
    front_end: Any = None,
    loop_pass_s: float = 0.0,
) -> ArmResult:
    """Replay segments in sequence through a fresh Kit in virtual time; raise on any violation.

    `seed` only labels the result: the replay itself is deterministic (arrival times come with
    the questions). `kit_overrides` go to KitConfig (rows, tokens, kv_tokens, ...). `host`:
    the scheduler's CPU time per launched round, (Round, ScanTiming) -> seconds (None: scans
    are free, the old twin); `on_forward(rows, tokens, seconds)` sees every simulated forward;
    `gpu`: prefill Round -> GPU seconds (default: `cost` of the round; `result.cost` stays
    `cost`; decode steps cost `cost.decode`). `ignore_eos`: the requests' sampling flag; False
    lets SGLang's admission reserve only its new-token ratio of running requests' outputs, so
    decode can run out of KV and retract (Kit.req). `executor`: the kit's (Kit.executor):
    "witness" checks every resumed state against its prefix and raises WitnessMismatch on the
    first wrong one; its counts are `metrics["witness"]`, the output ids `result.outputs`.
    `release_lag_s`: the questions one completion releases reach the scheduler this far apart,
    in send order (a live server's HTTP and tokenizer take each request in turn: ~9-13 ms on
    the 2-core box at the box profile); their latency still counts from the release, as the
    live client counts it from the send.
    `branch_spread_s`: a question's branches reach the scheduler this far apart, in branch
    order, instead of together (the live client sends them at once, but each goes through
    HTTP and the tokenizer in turn); its latency still counts from its arrival.
    `front_end`: an eval.frontend.FrontEnd, when each branch reaches the scheduler after its
    question's arrival (a per-question delay, then each branch in turn by its length), and
    how long after its forward the client receives a completion (its `back_s`: latencies and
    releases count from then); it is measured from the client's send, so it includes the send
    spread: not with `branch_spread_s`.
    `loop_pass_s`: the scheduler loop's pass from a launch or processed result to its next scan
    (testing/loop.py; eval/calibrate.py `loop_pass` fits it on a live server's trace).
    """
    import torch

    if front_end is not None and branch_spread_s:
        raise ValueError("front_end includes the client's send spread: give branch_spread_s 0")

    # NOTE: the kit's CPU tensors are small; torch's intra-op threads only contend (the pool's
    # free-list torch.cat ran 10x slower with 2 threads on a busy 2-core machine).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _replay(questions_or_segments, model, policy, layout=layout, overlap=overlap,
                       cost=cost, seed=seed, progress=progress, kit_overrides=kit_overrides,
                       radixflow_config=radixflow_config, host=host, on_forward=on_forward,
                       gpu=gpu, ignore_eos=ignore_eos, executor=executor,
                       release_lag_s=release_lag_s, branch_spread_s=branch_spread_s,
                       front_end=front_end, loop_pass_s=loop_pass_s)
    finally:
        torch.set_num_threads(threads)


def _replay(questions_or_segments, model, policy, *, layout, overlap, cost, seed, progress,
            kit_overrides, radixflow_config, host=None, on_forward=None, gpu=None,
            ignore_eos=True, executor="witness", release_lag_s=0.0,
            branch_spread_s=0.0, front_end=None, loop_pass_s=0.0) -> ArmResult:
    from radixflow_sglang.testing.kit import Kit, KitConfig
    from radixflow_sglang.testing.loop import VirtualClock, VirtualLoop

    t_wall = time.perf_counter()
    segments = as_segments(questions_or_segments)
    cost = cost or default_cost(model)
    clock = VirtualClock()
    kit = Kit(KitConfig(model=model, layout=layout, overlap=overlap, **(kit_overrides or {})),
              policy=policy, radixflow_config=radixflow_config, clock=clock, sleep=clock.sleep,
              executor=executor)
    rt = kit.runtime
    geo = kit.geometry
    rows_budget = kit.cfg.rows or geo.rows
    tokens_budget = kit.cfg.tokens or geo.tokens

    result = ArmResult(policy, model, layout, overlap, seed, cost=cost)
    branches: dict[str, _Branch] = {}
    n_questions = sum(len(s) for s in segments)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=n_questions, desc=f"{model} {policy}", unit="q", leave=False)
    q_done: list[int] = []
    q_size: list[int] = []
    seg_index = [0]
    followers: dict[int, list[int]] = {}  # question -> the questions released by its completion
    visible: dict[int, float] = {}  # a released question -> when the scheduler sees it
    qobj: dict[int, Question] = {}
    offsets = _branch_offsets(qobj, branch_spread_s, front_end)
    back_s = front_end.back_s if front_end is not None else 0.0

    def launched(launch) -> None:
        rnd = launch.round
        if rnd.mode == "decode":
            decoded(launch)
            return
        ri = len(result.rounds)
        if rnd.index != ri:
            raise ConservationError(f"kit round {rnd.index} recorded as round {ri}")
        hit = sum(rnd.prefix[r] - _live(r, f"round {ri}").computed() for r in rnd.rids)
        if rt is not None and host is not None:
            rt.observe_host(launch.host_s)  # NOTE: what a server measures around its scan
        result.rounds.append(RoundRecord(
            ri, seg_index[0], launch.scan_s, launch.start_s, launch.end_s, len(rnd.rids),
            rnd.scheduled_tokens, hit, attn_pairs(rnd.extend, rnd.prefix), launch.host_s))
        if len(set(rnd.rids)) != len(rnd.rids):
            raise ConservationError(f"round {ri} selects a request twice: {rnd.rids}")
        for rid in rnd.rids:
            br = _live(rid, f"round {ri}")
            if br.first_selection_s is None:
                br.first_selection_s = launch.scan_s
            br.chunks.append((rnd.prefix[rid], rnd.extend[rid]))
            br.last_round = ri
            if br.first_token_s is None and rnd.prefix[rid] + rnd.extend[rid] == br.target():
                br.first_token_s = launch.end_s  # its last chunk samples the first token

    def decoded(launch) -> None:
        rnd = launch.round
        di = len(result.decode_rounds)
        if rnd.index != di:
            raise ConservationError(f"kit decode step {rnd.index} recorded as step {di}")
        result.decode_rounds.append(RoundRecord(
            di, seg_index[0], launch.scan_s, launch.start_s, launch.end_s, len(rnd.rids), 0, 0,
            0.0, launch.host_s, mode="decode", cached_tokens=rnd.cached_tokens))
        for rid in rnd.rids:
            br = _live(rid, f"decode step {di}")
            if br.first_token_s is None or br.last_round < 0:
                raise ConservationError(f"decode step {di} runs {rid!r} before its prefill")

    def _live(rid: str, where: str) -> _Branch:
        br = branches.get(rid)
        if br is None:
            raise ConservationError(f"{where} selects unknown request {rid!r}")
        if br.completion_s is not None:
            raise ConservationError(f"{where} selects completed request {rid!r}")
        return br

    def retracted(req) -> None:
        br = branches[req.rid]
        br.lives.append((len(br.chunks), len(req.origin_input_ids) + len(req.output_ids)))

    def completed(rid: str, t: float) -> None:
        t += back_s  # NOTE: the client's receipt, which releases its followers
        br = branches.get(rid)
        if br is None:
            raise ConservationError(f"unknown request {rid!r} completed")
        if br.completion_s is not None:
            raise ConservationError(f"request {rid!r} completed twice")
        if br.last_round < 0:
            raise ConservationError(f"request {rid!r} completed without being selected")
        br.completion_s = t
        qi = br.question
        q_done[qi] += 1
        qr = result.questions[qi]
        qr.completion_s = t if q_done[qi] == 1 else max(qr.completion_s, t)
        if q_done[qi] == q_size[qi]:
            if bar is not None:
                bar.update(1)
            for k, f in enumerate(followers.pop(qi, ())):  # closed loop: sent now
                arrival = qr.completion_s + qobj[f].arrival_s
                result.questions[f].arrival_s = arrival
                visible[f] = arrival + k * release_lag_s
                for b in qobj[f].branches:
                    branches[b.rid].arrival_s = arrival
                for item in arrivals(f):
                    loop.arrive(item)

    def arrivals(qi: int) -> list[tuple[int, int | None]]:
        """The loop's arrivals of question `qi`: (qi, None), the whole question, or (a
        spread or a front end) (qi, j) for each of its branches."""
        if offsets(qi) is None:
            return [(qi, None)]
        return [(qi, j) for j in range(len(qobj[qi].branches))]

    def at(item: tuple[int, int | None]) -> float:
        qi, j = item
        base = visible.get(qi, result.questions[qi].arrival_s)
        return base if j is None else base + offsets(qi)[j]

    def submit(item: tuple[int, int | None]) -> None:
        qi, j = item
        q = qobj[qi]
        kit.submit(*[kit.req(b.rid, b.input_ids, b.namespace, max_new_tokens=b.max_new_tokens,
                             output=b.output, ignore_eos=ignore_eos, boundary=b.boundary)
                     for b in (q.branches if j is None else [q.branches[j]])])

    kit.on_retract = retracted
    prefill = gpu or (lambda rnd: cost.batch(rnd.extend, rnd.prefix))
    if rt is not None:
        rt.use_prior(default_cost(model))  # NOTE: what a server derives; the fit learns `cost`
        prefill = _observed(prefill, rt)
        prefill(_warmup_round())  # NOTE: measured before serving: takes no virtual time

    def gpu_s(rnd) -> float:
        return cost.step(rnd) if rnd.mode == "decode" else prefill(rnd)

    loop = VirtualLoop(kit, gpu_s, host=host,
                       clock=clock, on_launch=launched, on_complete=completed,
                       on_forward=on_forward, label=policy, pass_s=loop_pass_s)
    for si, seg in enumerate(segments):
        seg_index[0] = si
        l_cap, u = capacity_bound(seg, rows_budget, tokens_budget)
        offset = loop.now
        info = SegmentInfo(seg.name, seg.regime, seg.order, offset, offset, len(seg), l_cap, u)
        blocked0 = rt.totals.blocked if rt is not None else 0
        order = _questions(seg, result, branches, qobj, followers, q_done, q_size, si, offset)
        try:
            # NOTE: sorted is stable: without a spread, the questions in send order
            info.end_s = loop.run(sorted((it for qi in order for it in arrivals(qi)), key=at),
                                  at, submit)
        except RuntimeError as e:
            if "never processed" in str(e):
                raise ConservationError(f"segment {seg.name}: {e}") from None
            raise
        if followers:
            raise ConservationError(f"segment {seg.name}: questions never released: "
                                    f"{sorted(result.questions[f].qid for f in followers)}")
        info.blocked = (rt.totals.blocked if rt is not None else 0) - blocked0
        result.segments.append(info)
    if bar is not None:
        bar.close()

    leaks = kit.leaks()
    _check_conservation(result, branches)
    result.requests = branches
    ends = [r.end_s for r in result.rounds]
    for qr in result.questions:
        qr.rounds_waited = bisect_right(ends, qr.completion_s) - bisect_right(ends, qr.arrival_s)
    result.metrics = _all_metrics(result, branches, rt, leaks, rows_budget, tokens_budget)
    if host is not None:
        result.metrics["host_s"] = loop.host_s
    if kit.witness is not None:
        result.metrics["witness"] = kit.witness.stats.as_dict()
    result.outputs = loop.log.outputs
    if rt is not None:
        s = rt.summary()
        result.reasons = {**s["hold_reasons"], **s["order_reasons"], **s["reasons"],
                          **s["boundary_reasons"]}
    result.wall_s = time.perf_counter() - t_wall
    return result


def _branch_offsets(qobj: Mapping[int, Question], spread_s: float, front_end: Any
                    ) -> Callable[[int], list[float] | None]:
    """Per question, each branch's delay after the question's arrival (branch order): j *
    `spread_s`, or the front end's (eval/frontend.py; by the branches' lengths); None for
    every question where neither is given (the branches arrive together)."""
    if front_end is None and not spread_s:
        return lambda qi: None
    cache: dict[int, list[float]] = {}

    def offsets(qi: int) -> list[float]:
        if qi not in cache:
            lengths = [len(b.input_ids) for b in qobj[qi].branches]
            cache[qi] = (front_end.offsets(lengths, qobj[qi].branches[0].rid)
                         if front_end is not None
                         else [j * spread_s for j in range(len(lengths))])
        return cache[qi]

    return offsets


def _questions(seg: Segment, result: ArmResult, branches: dict[str, _Branch],
               qobj: dict[int, Question], followers: dict[int, list[int]], q_done: list[int],
               q_size: list[int], si: int, offset: float) -> list[int]:
    """Register a segment's questions; return the open-loop ones in arrival order (stable:
    send order kept). A question with `after` waits in `followers` for that one's completion."""
    by_qid: dict[str, int] = {}
    open_loop: list[int] = []
    for q in seg.questions:  # send order
        qi = len(result.questions)
        if q.after is not None:
            if q.after not in by_qid:
                raise ValueError(f"segment {seg.name}, question {q.qid!r}: after={q.after!r} "
                                 f"is not an earlier question of the segment")
            followers.setdefault(by_qid[q.after], []).append(qi)
        else:
            open_loop.append(qi)
        by_qid[q.qid] = qi
        arrival = offset + q.arrival_s if q.after is None else math.nan
        result.questions.append(QuestionRecord(q.qid, si, arrival, after=q.after is not None))
        q_done.append(0)
        q_size.append(len(q.branches))
        qobj[qi] = q
        for b in q.branches:
            if b.rid in branches:
                raise ValueError(f"duplicate request id {b.rid!r}")
            branches[b.rid] = _Branch(b.rid, qi, len(b.input_ids), arrival,
                                      outputs=b.max_new_tokens)
    return sorted(open_loop, key=lambda qi: result.questions[qi].arrival_s)


def _warmup_round(tokens: int = 16):
    """SGLang's server warmup (entrypoints/http_server.py `_execute_server_warmup`): one short
    prefill before the first request, whose forward a server's round-cost fit measures."""
    from radixflow_sglang.testing.kit import Round

    w = "warmup"
    return Round(-1, [w], {w: tokens}, {w: 0}, {w: None}, None)


def _observed(gpu, rt):
    """The runtime's round-cost fit sees every forward's virtual time, as a server's does."""

    def timed(rnd) -> float:
        c = gpu(rnd)
        rt.observe_forward(len(rnd.extend), rnd.scheduled_tokens, c,
                           pairs=attn_pairs(rnd.extend, rnd.prefix))
        return c

    return timed


def _check_conservation(result: ArmResult, branches: dict[str, _Branch]) -> None:
    missing = [rid for rid, b in branches.items() if b.completion_s is None]
    if missing:
        raise ConservationError(f"{len(missing)} requests never completed, e.g. {missing[:3]}")
    expected = 0
    for rid, b in branches.items():
        for life, (target, chunks) in enumerate(b.life_chunks()):
            if not chunks:
                raise ConservationError(f"{rid}: life {life} (after a retraction) never ran")
            pos = p0 = chunks[0][0]
            for i, (p, e) in enumerate(chunks):
                if p != pos:
                    raise ConservationError(f"{rid}: life {life} chunk {i} starts at prefix {p}, "
                                            f"previous chunk ended at {pos}")
                if e <= 0:
                    raise ConservationError(f"{rid}: life {life} chunk {i} extends {e} tokens")
                pos = p + e
            if pos != target:
                raise ConservationError(f"{rid}: life {life} computed up to {pos} of {target} "
                                        f"tokens")
            expected += target - p0
    scheduled = sum(r.tokens for r in result.rounds)
    if scheduled != expected:
        raise ConservationError(
            f"scheduled {scheduled} tokens, requests needed {expected} beyond their first hit")
    for q in result.questions:
        if not q.completion_s >= q.arrival_s:
            raise ConservationError(f"{q.qid}: completion {q.completion_s} before arrival")


# --------------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------------


def _pct(xs: np.ndarray, p: float) -> float:
    return float(np.percentile(xs, p)) if xs.size else math.nan


def _reprefill(b: _Branch) -> int:
    """Tokens a retracted request scheduled again: every life after the first."""
    return sum(t - chunks[0][0] for t, chunks in b.life_chunks()[1:])


def _metrics(rounds: Sequence[RoundRecord], questions: Sequence[QuestionRecord],
             brs: Sequence[_Branch], decode: Sequence[RoundRecord] = ()) -> dict[str, Any]:
    lat = np.array([q.latency_s for q in questions], dtype=float)
    sched = sum(r.tokens for r in rounds)
    inp = sum(b.input_len for b in brs)
    hit = sum(b.chunks[0][0] for b in brs)
    ttft = np.array([b.first_token_s - b.arrival_s for b in brs], dtype=float)
    req_lat = np.array([b.completion_s - b.arrival_s for b in brs], dtype=float)
    n = len(rounds)
    busy = sum(r.cost_s for r in rounds)
    waited = np.array([q.rounds_waited for q in questions], dtype=float)
    return {
        "questions": len(questions),
        "requests": len(brs),
        "rounds": n,
        "scheduled_tokens": sched,
        "hit_tokens": hit,
        "input_tokens": inp,
        "reuse": hit / inp if inp else 0.0,
        "rows_per_round": sum(r.rows for r in rounds) / n if n else 0.0,
        "tokens_per_round": sched / n if n else 0.0,
        "latency_mean_s": float(lat.mean()) if lat.size else math.nan,
        "latency_p50_s": _pct(lat, 50),
        "latency_p95_s": _pct(lat, 95),
        "latency_p99_s": _pct(lat, 99),
        "sender_lag_mean_s": 0.0,  # arrivals are exact in virtual time
        "first_selection_mean_s": float(np.mean([b.first_selection_s - b.arrival_s
                                                 for b in brs])) if brs else math.nan,
        "busy_s": busy,
        "mean_round_cost_s": busy / n if n else 0.0,
        "rounds_waited_mean": float(waited.mean()) if waited.size else 0.0,
        "decode_steps": len(decode),
        "decode_s": sum(r.cost_s for r in decode),
        "decode_rows_per_step": sum(r.rows for r in decode) / len(decode) if decode else 0.0,
        "ttft_mean_s": float(ttft.mean()) if ttft.size else math.nan,
        "ttft_p95_s": _pct(ttft, 95),
        "request_latency_mean_s": float(req_lat.mean()) if req_lat.size else math.nan,
        "request_latency_p95_s": _pct(req_lat, 95),
        "retractions": sum(len(b.lives) for b in brs),
        "reprefill_tokens": sum(_reprefill(b) for b in brs),
        "output_tokens": sum(b.outputs for b in brs),
    }


def _all_metrics(result: ArmResult, branches: dict[str, _Branch], rt, leaks: dict[str, int],
                 rows: int, tokens: int) -> dict[str, Any]:
    by_q: dict[int, list[_Branch]] = {}
    for b in branches.values():
        by_q.setdefault(b.question, []).append(b)

    def subset(seg_ids: set[int]) -> dict[str, Any]:
        rs = [r for r in result.rounds if r.segment in seg_ids]
        ds = [r for r in result.decode_rounds if r.segment in seg_ids]
        qs = [(i, q) for i, q in enumerate(result.questions) if q.segment in seg_ids]
        brs = [b for i, _ in qs for b in by_q[i]]
        m = _metrics(rs, [q for _, q in qs], brs, ds)
        # NOTE: issue 15's follower count: requests whose first prefill started from no cache
        m["zero_hit_requests"] = sum(1 for b in brs if b.chunks and b.chunks[0][0] == 0)
        m["zero_hit_after_requests"] = sum(
            1 for i, q in qs if q.after for b in by_q[i] if b.chunks and b.chunks[0][0] == 0)
        m["after_requests"] = sum(len(by_q[i]) for i, q in qs if q.after)
        segs = [s for i, s in enumerate(result.segments) if i in seg_ids]
        m["l_cap"] = sum(s.l_cap for s in segs)
        m["unique_tokens"] = sum(s.unique_tokens for s in segs)
        m["rounds_over_l_cap"] = m["rounds"] / m["l_cap"] if m["l_cap"] else math.nan
        m["blocked"] = sum(s.blocked for s in segs)
        m["makespan_s"] = sum(s.end_s - s.start_s for s in segs)
        return m

    m = subset(set(range(len(result.segments))))
    totals = rt.totals if rt is not None else None
    m["blocked"] = totals.blocked if totals else 0
    m["recomputed"] = totals.recomputed if totals else 0  # Blocked, cost rule: recompute
    m["parked_max_rounds"] = totals.parked_max_rounds if totals else 0
    m["forks"] = totals.forks if totals else 0
    m["released_by_bound"] = totals.released_by_bound if totals else 0
    m["frag_deferred"] = totals.frag_deferred if totals else 0
    m["newcomer_deferred"] = totals.newcomer_deferred if totals else 0
    m["held_iterations"] = getattr(rt, "held_iterations", 0) if rt is not None else 0
    m["leaked_kv_slots"] = leaks.get("kv", 0)
    m["leaked_mamba_slots"] = leaks.get("mamba", 0)
    m["leaked_rows"] = leaks.get("rows", 0)
    m["row_budget"] = rows
    m["token_budget"] = tokens
    m["per_segment"] = {s.name: subset({i}) for i, s in enumerate(result.segments)}
    regimes: dict[str, set[int]] = {}
    for i, s in enumerate(result.segments):
        regimes.setdefault(s.regime, set()).add(i)
    m["per_regime"] = {reg: subset(ids) for reg, ids in regimes.items()}
    missing = [k for k in METRIC_KEYS if k not in m]
    assert not missing, missing
    return m


def eq2_split(arm: dict[str, Any], base: dict[str, Any]) -> dict[str, float]:
    """Latency (and busy-time) difference arm - base = round credit + cost shift (docstring)."""
    n_a, n_b = arm["rounds_waited_mean"], base["rounds_waited_mean"]
    l_a, l_b = arm["latency_mean_s"], base["latency_mean_s"]
    c_a = l_a / n_a if n_a else 0.0
    c_b = l_b / n_b if n_b else 0.0
    r_a, r_b = arm["rounds"], base["rounds"]
    k_a, k_b = arm["mean_round_cost_s"], base["mean_round_cost_s"]
    return {
        "latency_diff_s": l_a - l_b,
        "round_credit_s": (n_a - n_b) * c_b,
        "cost_shift_s": (c_a - c_b) * n_a,
        "rounds_waited": n_a,
        "rounds_waited_base": n_b,
        "cost_per_waited_round_s": c_a,
        "cost_per_waited_round_base_s": c_b,
        "busy_diff_s": arm["busy_s"] - base["busy_s"],
        "busy_round_credit_s": (r_a - r_b) * k_b,
        "busy_cost_shift_s": (k_a - k_b) * r_a,
    }


# --------------------------------------------------------------------------------------------
# A small probe workload and one arm
# --------------------------------------------------------------------------------------------


def probe_segments(seed: int = 0, tokens: int = 8192) -> list[Segment]:
    """A small workload that exercises sharing, parking, admission holds and a fragment.

    Two synthetic segments (reuse and mixed regimes, 10 questions at 20 q/s: shared prefixes,
    chunked long documents, partial rounds), then a burst of two unrelated requests of
    tokens - 40 and 500 tokens: after the first, the round has 40 < G tokens left, so the
    second would be cut into a fragment too short to publish a state.
    """
    import random

    from eval.workload import Branch, arrange, offered_trace, synthetic

    qs = synthetic(10, profile="mix", seed=seed)
    segs = [Segment(r, "forward", tuple(offered_trace(arrange(qs, r, tag=f"probe-{r}"),
                                                      rate=20.0, seed=seed)))
            for r in ("reuse", "mixed")]
    rng = random.Random(seed)
    burst = tuple(
        Question(f"probe-frag-{i}", f"probe-frag-{i}",
                 (Branch(f"probe-frag/{i}", [rng.randrange(1000, 100_000) for _ in range(n)],
                         f"probe-frag/{i}", 0),), 0, 0)
        for i, n in enumerate((tokens - 40, 500)))
    return [*segs, Segment("cold", "forward", burst)]


def run_arm(segments: Sequence[Segment], model: str, policy: str, *, layout: str = "extra_buffer",
            overlap: bool = False, cost: CostModel | None = None, seed: int = 0,
            progress: bool = False, host: Any = None,
            radixflow_config: Any = None, executor: str = "witness",
            kit_overrides: dict[str, Any] | None = None,
            release_lag_s: float = 0.0, branch_spread_s: float = 0.0,
            front_end: Any = None, loop_pass_s: float = 0.0) -> ArmResult:
    """`replay`, where a failure is a failed arm: it carries its error and no numbers.

    `host`: an eval.hostcost.HostCost (the fair twin: the scheduler's CPU time takes virtual
    time, and the cost model's alpha/gamma lose their host part) or None (free scans).
    `kit_overrides`: KitConfig fields (e.g. schedule_policy "lpm" for the stock-lpm arm)."""
    from eval.hostcost import gpu_cost

    t0 = time.perf_counter()
    try:
        cost = cost or default_cost(model)
        fn = host.host_fn(policy) if host is not None else None
        res = replay(segments, model, policy, layout=layout, overlap=overlap, cost=cost,
                     seed=seed, progress=progress, host=fn, gpu=gpu_cost(cost, host),
                     radixflow_config=radixflow_config, executor=executor,
                     kit_overrides=kit_overrides, release_lag_s=release_lag_s,
                     branch_spread_s=branch_spread_s, front_end=front_end,
                     loop_pass_s=loop_pass_s)
    except Exception as e:  # noqa: BLE001
        return ArmResult(policy, model, layout, overlap, seed, error=f"{type(e).__name__}: {e}",
                         wall_s=time.perf_counter() - t0)
    res.wall_s = time.perf_counter() - t0
    return res


__all__ = [
    "METRIC_KEYS", "ArmResult", "ConservationError", "RoundRecord", "QuestionRecord",
    "SegmentInfo", "as_segments", "capacity_bound", "eq2_split", "probe_segments",
    "lcp", "replay", "run_arm", "unique_tokens",
]
