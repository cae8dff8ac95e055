"""Traffic beyond the paper's four-branch shape (issue 12): generators of Segments of Questions.

One entry point, `segments(name, model, *, seed, rate, **shape)`; `eval.workload.workload()`
dispatches to it for these names. Every prompt is random ids in SYNTHETIC_ID_RANGE (valid for
every catalog model, no tokenizer needed), lengths are exact, and a Question is the latency
unit (arrival -> its last branch done).

* `gsp`: SGLang's generated-shared-prefix benchmark (sglang/benchmark/datasets/
  generated_shared_prefix.py `sample_generated_shared_prefix_requests` with `--tokenize-prompt`:
  prompt = system prompt ids + question ids, exact lengths at its default range ratio 1.0,
  requests shuffled as without `--gsp-ordered`). Defaults are issue 12's (16 groups x 4, system
  2,048, question 64, output 4), not bench_serving's (64 x 16, 2,048, 128, 256). Every request is
  its own Question; arrivals Poisson at `rate` requests/s, default inf (the burst: all at t=0, no
  warm-up). Branch.boundary = the system-prompt length (issue 15's declared boundary).
* `gsp-paced`: the same prompts; each group's first request arrives at its time (Poisson at
  `rate` groups/s, default inf), its siblings `after` it with gap 0 (together, once it finished).
* `sibling-after-completion` (issue 51): groups of `prompts_per_group` siblings on a shared
  `system_len`-token prefix (default 16 x 4, 1,024 + 64, one output token); each group's first
  request arrives alone (Poisson at `rate` groups/s, default 2), completes, then its siblings
  arrive together (`after` it, gap 0). No boundary is declared: the held-out client that found
  the shape sends none, so the server must learn where the siblings' prefix ends.
* `nsample` (`nsample_mode` burst | warm): `prompts` prompts of `prompt_len` ids, Poisson at
  `rate` prompts/s (default 1); burst: one Question of `n` identical branches (what RL rollout
  frameworks send); warm: SGLang's `n` path (managers/tokenizer_manager.py
  `_handle_batch_request`): a Question of one max_new_tokens=0 branch, then the `n` identical
  branches `after` it with gap 0. Both modes draw the same prompts for a seed.
* `multiturn`: `conversations` conversations of `turns` turns; turn k+1's prompt = turn k's
  prompt + turn k's scripted output (Branch.output) + `user_len` new ids, `after` turn k with an
  exponential think gap (mean `think_s`). Conversations start Poisson at `rate`/s (default 1);
  send order interleaves them (every first turn, then every second turn, ...).
* `noshare`: `prompts` independent prompts of `prompt_len` ids (a gsp prompt's length), Poisson
  at `rate` requests/s (default 4).

Only gsp / gsp-paced declare a boundary (the end of the system message, a boundary the server
can know); the others declare none, as their real senders would not. One segment per call, one
cache namespace (`{name}/s{seed}`, as one server sees it); its regime is the prompt family
(gsp, nsample, multiturn, noshare) and its order the variant (burst, poisson, paced, warm,
closed), so the segment is named e.g. gsp-burst, gsp-paced, nsample-warm. Content and arrival
gaps come from separate seeded streams: the rate never changes the prompts, and gsp / gsp-paced
(nsample burst / warm) share their prompts for a seed.
"""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass, fields
from typing import Any

from eval.requests import SYNTHETIC_ID_RANGE, Branch, Question, Segment
from eval.requests import model_key as _model_key
from radixflow_sglang import models

SIBLING = "sibling-after-completion"
WORKLOADS = ("gsp", "gsp-paced", SIBLING, "nsample", "multiturn", "noshare")
NSAMPLE_MODES = ("burst", "warm")
DEFAULT_RATE = {"gsp": math.inf, "gsp-paced": math.inf, SIBLING: 2.0, "nsample": 1.0,
                "multiturn": 1.0, "noshare": 4.0}


# --------------------------------------------------------------------------------------------
# Shapes (field name <-> CLI flag: --field-name)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GspShape:
    groups: int = 16
    prompts_per_group: int = 4
    system_len: int = 2048
    question_len: int = 64
    output_len: int = 4

    def max_len(self) -> int:
        return self.system_len + self.question_len + self.output_len


@dataclass(frozen=True)
class SiblingShape(GspShape):
    """The held-out client's groups (issue 51): 1,024-token shared prefixes, one output token."""

    system_len: int = 1024
    output_len: int = 1


@dataclass(frozen=True)
class NSampleShape:
    nsample_mode: str = "burst"
    prompts: int = 16
    n: int = 8
    prompt_len: int = 1024
    output_len: int = 128

    def max_len(self) -> int:
        return self.prompt_len + self.output_len


@dataclass(frozen=True)
class MultiturnShape:
    conversations: int = 8
    turns: int = 4
    prompt_len: int = 1024
    user_len: int = 128
    output_len: int = 128
    think_s: float = 1.0

    def max_len(self) -> int:
        return self.prompt_len + self.turns * self.output_len + (self.turns - 1) * self.user_len


@dataclass(frozen=True)
class NoshareShape:
    prompts: int = 64
    prompt_len: int = 2112  # a gsp prompt: 2,048 + 64
    output_len: int = 4

    def max_len(self) -> int:
        return self.prompt_len + self.output_len


SHAPES: dict[str, type] = {"gsp": GspShape, "gsp-paced": GspShape, SIBLING: SiblingShape,
                           "nsample": NSampleShape,
                           "multiturn": MultiturnShape, "noshare": NoshareShape}
# NOTE: output_len 0 is a prefill-only request (allowed); every count and prompt piece >= 1.
_MIN = {"output_len": 0, "think_s": 0.0}


def flag(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def shape_fields(name: str) -> tuple[str, ...]:
    return tuple(f.name for f in fields(SHAPES[_check_name(name)]))


def all_shape_fields() -> tuple[str, ...]:
    """Every shape field of every workload, in first-seen order (the CLI's shape flags)."""
    out: dict[str, None] = {}
    for cls in SHAPES.values():
        out.update((f.name, None) for f in fields(cls))
    return tuple(out)


def _check_name(name: str) -> str:
    if name not in SHAPES:
        raise ValueError(f"unknown traffic workload {name!r}; use one of {', '.join(WORKLOADS)}")
    return name


def make_shape(name: str, **shape: Any) -> Any:
    """The workload's shape with `shape` overriding its defaults (None: the default); errors
    name the flag."""
    cls = SHAPES[_check_name(name)]
    shape = {k: v for k, v in shape.items() if v is not None}
    known = shape_fields(name)
    for key in shape:
        if key not in known:
            raise ValueError(f"{flag(key)} does not apply to --workload {name} (its flags: "
                             f"{', '.join(flag(k) for k in known)})")
    s = cls(**shape)
    for f in fields(s):
        v = getattr(s, f.name)
        if f.name == "nsample_mode":
            if v not in NSAMPLE_MODES:
                raise ValueError(f"{flag(f.name)} must be one of {', '.join(NSAMPLE_MODES)}, "
                                 f"got {v!r}")
            continue
        lo = _MIN.get(f.name, 1)
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v < math.inf:
            raise ValueError(f"{flag(f.name)} must be a number >= {lo}, got {v!r}")
        if isinstance(lo, int) and not isinstance(v, int):
            raise ValueError(f"{flag(f.name)} must be an integer >= {lo}, got {v!r}")
    if s.max_len() > models.CONTEXT_LENGTH:
        raise ValueError(f"--workload {name}: the longest request needs {s.max_len()} tokens "
                         f"(prompt + output), over the context length {models.CONTEXT_LENGTH}; "
                         f"lower {', '.join(flag(k) for k in known if k.endswith('_len'))}")
    return s


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def segments(name: str, model: str, *, seed: int = 0, rate: float | None = None,
             **shape: Any) -> list[Segment]:
    """The workload `name` as one Segment; `rate` None takes DEFAULT_RATE[name]."""
    shp = make_shape(name, **shape)
    _model_key(model)  # NOTE: ids are valid for every catalog model; an unknown one is an error
    rate = DEFAULT_RATE[name] if rate is None else rate
    if not rate > 0:
        raise ValueError(f"rate must be > 0 (per second; inf = all at once), got {rate}")
    gen = _Gen(name, seed, rate)
    if name in ("gsp", "gsp-paced", SIBLING):
        return [gen.gsp(shp, paced=name != "gsp", declare=name != SIBLING)]
    if name == "nsample":
        return [gen.nsample(shp)]
    if name == "multiturn":
        return [gen.multiturn(shp)]
    return [gen.noshare(shp)]


def describe(name: str, seed: int = 0, rate: float | None = None, **shape: Any) -> dict[str, Any]:
    """The shape actually generated (defaults filled in), for summary.json."""
    rate = DEFAULT_RATE[_check_name(name)] if rate is None else rate
    return {"workload": name, "seed": seed, "rate": rate if math.isfinite(rate) else "inf",
            **dataclasses.asdict(make_shape(name, **shape))}


# --------------------------------------------------------------------------------------------
# Generators
# --------------------------------------------------------------------------------------------


class _Gen:
    """Seeded streams: `content` draws ids (keyed by the prompt family, so variants of one
    family share prompts), `gaps` draws arrival and think gaps."""

    def __init__(self, name: str, seed: int, rate: float) -> None:
        family = {"gsp-paced": "gsp", SIBLING: "sibling"}.get(name, name)
        self.name, self.family, self.seed, self.rate = name, family, seed, rate
        self.content = random.Random(f"traffic/{family}/content/{seed}")
        self.gaps = random.Random(f"traffic/{name}/gaps/{seed}")
        self.namespace = f"{name}/s{seed}"

    def ids(self, n: int) -> list[int]:
        lo, hi = SYNTHETIC_ID_RANGE
        r = self.content.randrange
        return [r(lo, hi) for _ in range(n)]

    def arrivals(self, n: int) -> list[float]:
        """Poisson at self.rate, the first at 0 (as workload.offered_trace); inf: all at 0."""
        t, out = 0.0, []
        for i in range(n):
            if i and not math.isinf(self.rate):
                t += self.gaps.expovariate(self.rate)
            out.append(t)
        return out

    def question(self, qid: str, doc_id: str, inputs: list[list[int]], *, prefix_len: int,
                 arrival_s: float = 0.0, after: str | None = None, max_new_tokens: int = 1,
                 output: tuple[int, ...] = (), boundary: int | None = None) -> Question:
        branches = tuple(
            Branch(f"{self.namespace}/{qid}/{k}", ids, self.namespace, k,
                   max_new_tokens=max_new_tokens, output=output, boundary=boundary)
            for k, ids in enumerate(inputs))
        return Question(qid, doc_id, branches, prefix_len, prefix_len, None, arrival_s,
                        f"{self.name} seed {self.seed} {qid}", after)

    def _segment(self, order: str, qs: list[Question]) -> Segment:
        return Segment(self.family, order, tuple(qs))

    def gsp(self, s: GspShape, *, paced: bool, declare: bool = True) -> Segment:
        systems = [self.ids(s.system_len) for _ in range(s.groups)]
        prompts = [[systems[g] + self.ids(s.question_len) for _ in range(s.prompts_per_group)]
                   for g in range(s.groups)]

        def q(g: int, p: int, **kw: Any) -> Question:
            return self.question(f"g{g}.p{p}", f"g{g}", [prompts[g][p]],
                                 prefix_len=s.system_len, max_new_tokens=s.output_len,
                                 boundary=s.system_len if declare else None, **kw)

        if not paced:
            slots = [(g, p) for g in range(s.groups) for p in range(s.prompts_per_group)]
            self.content.shuffle(slots)  # NOTE: bench_serving shuffles unless --gsp-ordered
            times = self.arrivals(len(slots))
            return self._segment("burst" if math.isinf(self.rate) else "poisson",
                                 [q(g, p, arrival_s=t) for (g, p), t in zip(slots, times,
                                                                            strict=True)])
        times = self.arrivals(s.groups)
        firsts = [q(g, 0, arrival_s=times[g]) for g in range(s.groups)]
        siblings = [q(g, p, after=firsts[g].qid) for g in range(s.groups)
                    for p in range(1, s.prompts_per_group)]
        return self._segment("paced", firsts + siblings)

    def nsample(self, s: NSampleShape) -> Segment:
        prompts = [self.ids(s.prompt_len) for _ in range(s.prompts)]
        times = self.arrivals(s.prompts)
        out: list[Question] = []
        for i, (ids, t) in enumerate(zip(prompts, times, strict=True)):
            qid = f"p{i}"
            kw: dict[str, Any] = {"arrival_s": t}
            if s.nsample_mode == "warm":
                warm = self.question(f"{qid}.warm", qid, [ids], prefix_len=s.prompt_len,
                                     max_new_tokens=0, arrival_s=t)
                out.append(warm)
                kw = {"after": warm.qid}
            out.append(self.question(qid, qid, [ids] * s.n, prefix_len=s.prompt_len,
                                     max_new_tokens=s.output_len, **kw))
        return self._segment(s.nsample_mode, out)

    def multiturn(self, s: MultiturnShape) -> Segment:
        starts = self.arrivals(s.conversations)
        turns: list[list[Question]] = [[] for _ in range(s.turns)]
        for c in range(s.conversations):
            prompt, prev = self.ids(s.prompt_len), None
            for k in range(s.turns):
                if prev is not None:
                    b = prev.branches[0]
                    prompt = b.input_ids + list(b.output) + self.ids(s.user_len)
                gap = self.gaps.expovariate(1 / s.think_s) if s.think_s > 0 else 0.0
                out = tuple(self.ids(s.output_len))
                prev = self.question(
                    f"c{c}.t{k}", f"c{c}", [prompt],
                    prefix_len=0 if prev is None else len(prev.branches[0].input_ids)
                    + s.output_len,
                    arrival_s=starts[c] if prev is None else gap,
                    after=None if prev is None else prev.qid,
                    max_new_tokens=s.output_len, output=out)
                turns[k].append(prev)
        return self._segment("closed", [q for turn in turns for q in turn])

    def noshare(self, s: NoshareShape) -> Segment:
        prompts = [self.ids(s.prompt_len) for _ in range(s.prompts)]
        times = self.arrivals(s.prompts)
        return self._segment("poisson", [
            self.question(f"r{i}", f"r{i}", [ids], prefix_len=0, max_new_tokens=s.output_len,
                          arrival_s=t) for i, (ids, t) in enumerate(zip(prompts, times,
                                                                        strict=True))])
