"""The live server's front end in the twin: when each branch of a question reaches the scheduler.

A live client sends a question's branches at once; SGLang's HTTP server and tokenizer manager
hand them to the scheduler one after another, a few ms later (docs/notes/2026-12-live-two-
profiles.md, section 5). The model: branch j of a question (branch order) becomes visible at

    arrival + c + sum over branches k <= j of (a + b * tokens_k)

c: per question (HTTP, the event loops, ZMQ, the scheduler's next pass), a + b * tokens: per
branch, in turn (the tokenizer manager takes them one at a time; a longer prompt takes longer to
parse and to pass on). Optional: `jitter`, each branch drawn about that mean (a generator
seeded by the question's first rid: the same every run), which spreads a question's branches
as the live ones spread; `back`, the way back (result processing, detokenizer, tokenizer
manager, HTTP) from a forward's end to the client's receipt, added to every completion.
Latency still counts from the arrival, as the live client counts it from the send.

`fit_runs` fits c, a, b by least squares on live runs: per question, its branches' `registered`
stamps (the trace's `selected` events) in registration order against the question's send
(`q_send_s` in the client's requests.jsonl), only where no forward ran between the send and the
last registration (a forward holds the loop, and the twin already charges that wait); `jitter`
is the residuals' sd about each question's own mean; `back` the median of `done_s` after the
forward that finished a one-token request.

`python -m eval.frontend DIR...`: the fit over every arm directory under DIR with both files.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MIN_QUESTIONS = 10  # fewer clean questions pin nothing down (a fit returns None)


@dataclass(frozen=True)
class FrontEnd:
    """c + sum_{k<=j} (a + b * tokens_k) seconds from a question's arrival to its branch j."""

    c_s: float  # per question
    a_s: float  # per branch
    b_s: float  # per token of a branch
    source: str
    jitter_s: float = 0.0  # sd of a branch's own delay about its question's (seeded by rid)
    back_s: float = 0.0  # a forward's end to the client's receipt of what it finished
    questions: int = 0  # questions the fit read (0: not fitted)
    resid_s: float | None = None  # the fit's residual standard deviation

    def offsets(self, lengths: Sequence[int], key: str = "") -> list[float]:
        """Each branch's delay after the question's arrival (branch order); with `jitter_s`
        each drawn about its mean from a generator seeded by `key` (the same every run)."""
        rng = random.Random(key) if self.jitter_s else None
        out, t = [], self.c_s
        for n in lengths:
            t += self.a_s + self.b_s * n
            out.append(t if rng is None else max(0.0, t + rng.gauss(0.0, self.jitter_s)))
        return out

    def describe(self) -> str:
        fit = "" if self.resid_s is None else (
            f"; {self.questions} questions, residual sd {self.resid_s * 1e3:.2f} ms")
        extra = (f", each +- {self.jitter_s * 1e3:.2f} ms" if self.jitter_s else "") + (
            f"; responses {self.back_s * 1e3:.2f} ms after the forward" if self.back_s else "")
        return (f"front end {self.c_s * 1e3:.2f} ms a question + {self.a_s * 1e3:.3f} ms + "
                f"{self.b_s * 1e6:.3f} us/token a branch, in turn{extra} ({self.source}{fit})")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"c_ms": self.c_s * 1e3, "a_ms": self.a_s * 1e3,
                               "b_us_per_token": self.b_s * 1e6,
                               "jitter_ms": self.jitter_s * 1e3, "back_ms": self.back_s * 1e3}


# NOTE: `python -m eval.frontend out/ab51-xb/profile-box/paper out/ab51-xb/profile-paper/paper
# out/ab52-box-xb/paper out/ab52-paper-xb/paper`: 12 quiet live radixflow runs of paper mix
# (24 questions x 6 segments, qwen3.5-0.8b, the 2-core box), both profiles; per run c 4.0-4.7
# ms, a 0.34-0.70 ms, b 0.29-0.44 us/token, residual sd 1.3-1.8 ms (a branch about its
# question: 0.73-1.11), responses 9.9-10.8 ms (box) and 10.6-11.6 ms (paper) after the forward
FITTED = FrontEnd(4.43e-3, 0.466e-3, 0.353e-6,
                  "fitted: live paper mix, ab51-xb + ab52-{box,paper}-xb, 12 runs",
                  jitter_s=0.90e-3, back_s=10.72e-3, questions=837, resid_s=1.58e-3)


def parse(text: str) -> FrontEnd | None:
    """--front-end: `off` (None), `fitted` (FITTED) or `C_MS,A_MS,B_US[,JITTER_MS[,BACK_MS]]`
    (per question ms, per branch ms, per token us; a branch's sd about its mean, ms; the
    response path, ms)."""
    if text == "off":
        return None
    if text == "fitted":
        return FITTED
    try:
        terms = [float(x) for x in text.split(",")]
    except ValueError:
        terms = []
    if not 3 <= len(terms) <= 5:
        raise ValueError(f"front end {text!r}: off, fitted, or C_MS,A_MS,B_US[,JITTER_MS"
                         "[,BACK_MS]] (three to five numbers)")
    if min(terms) < 0 or not all(map(math.isfinite, terms)):
        raise ValueError(f"front end {text!r}: every term must be a finite number >= 0")
    c, a, b, jitter, back = [*terms, 0.0, 0.0][:5]
    return FrontEnd(c / 1e3, a / 1e3, b / 1e6, f"given: {text}", jitter / 1e3, back / 1e3)


def twin_choice(text: str) -> str:
    """--twin-front-end (an argparse type): `live` or what `parse` takes."""
    if text != "live":
        try:
            parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return text


def for_twin(choice: str, arm_dir: Path | None) -> FrontEnd | None:
    """The front end a twin beside a live run takes: `live` fits the live arm's own records
    and trace (`arm_dir`; None where they pin nothing down, or without one), else `parse`."""
    if choice != "live":
        return parse(choice)
    if arm_dir is None:
        return None
    return arm_observations(arm_dir).fit(f"fitted on the live run {arm_dir}")


def busy_spans(events: Iterable[Mapping[str, Any]]) -> list[tuple[float, float]]:
    """Each prefill round's scan start to its forward's end (the loop registers nothing then)."""
    events = list(events)
    rounds = {e["round"]: e for e in events if e.get("event") == "round" and "t_start" in e}
    return [(rounds[e["round"]]["t_start"], rounds[e["round"]]["t_end"] + e["duration_s"])
            for e in events if e.get("event") == "forward" and e.get("round") in rounds]


def observations(records: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]]
                 ) -> list[list[tuple[int, float]]]:
    """Per question no forward delayed: its branches as (tokens, seconds from the question's
    send to the branch's registration), in registration order."""
    events = list(events)
    reg = {e["rid"]: e["registered"] for e in events
           if e.get("event") == "selected" and e.get("registered") is not None}
    spans = busy_spans(events)
    questions: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in records:
        if r.get("send_s") is not None and reg.get(r.get("server_rid")) is not None:
            questions.setdefault((r.get("segment"), r.get("qid")), []).append(r)
    out = []
    for rs in questions.values():
        send = min(r.get("q_send_s") or r["send_s"] for r in rs)
        stamps = sorted((reg[r["server_rid"]], _tokens(r)) for r in rs)
        if not any(s < stamps[-1][0] and e > send for s, e in spans):
            out.append([(n, t - send) for t, n in stamps])
    return out


def _tokens(r: Mapping[str, Any]) -> int:
    return int(r.get("prompt_tokens") or r.get("input_len") or 0)


def fit(obs: Sequence[Sequence[tuple[int, float]]], source: str,
        backs: Sequence[float] = ()) -> FrontEnd | None:
    """Least squares of t_i = c + (i + 1) a + b * (tokens of branches 0..i), over every
    question's i-th registration. With one branch per question c and a are one term (a = 0);
    with one length, b is (b = 0). Negative terms are 0. jitter: the residuals' sd about
    their question's mean; back: the median of `backs` (`back_delays`). None: under
    MIN_QUESTIONS."""
    import numpy as np

    if len(obs) < MIN_QUESTIONS:
        return None
    rows, ys, q_of = [], [], []
    for qi, q in enumerate(obs):
        cum = 0
        for i, (n, t) in enumerate(q):
            cum += n
            rows.append([1.0, i + 1.0, float(cum)])
            ys.append(t)
            q_of.append(qi)
    x, y = np.array(rows), np.array(ys)
    for cols in ([0, 1, 2], [0, 2], [0]):  # NOTE: drop what the data cannot tell apart
        coef, _, rank, _ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if rank == len(cols):
            break
    got = dict(zip(cols, coef, strict=True))
    terms = [max(0.0, float(got.get(i, 0.0))) for i in range(3)]  # NOTE: a delay is >= 0
    resid = y - x @ np.array(terms)
    return FrontEnd(*terms, source, _within_sd(resid, np.array(q_of)),
                    statistics.median(backs) if backs else 0.0, questions=len(obs),
                    resid_s=float(resid.std()))


def _within_sd(resid, q_of) -> float:
    """A branch's sd about its own question's mean (what spreads one question's branches; a
    shift of the whole question does not): the pooled within-question variance, each
    question's mean taking one degree of freedom (0 with one branch a question)."""
    import numpy as np

    counts = np.bincount(q_of)
    means = np.bincount(q_of, weights=resid) / counts
    free = len(resid) - len(counts)
    return float(np.sqrt(((resid - means[q_of]) ** 2).sum() / free)) if free else 0.0


def back_delays(records: Iterable[Mapping[str, Any]], events: Iterable[Mapping[str, Any]]
                ) -> list[float]:
    """Per one-token request (its last prefill chunk samples its only token): the client's
    receipt (`done_s`) after that forward's end (result processing, detokenizer, tokenizer
    manager, HTTP: what the twin's completion at the forward's end leaves out)."""
    events = list(events)
    rounds = {e["round"]: e for e in events if e.get("event") == "round" and "t_end" in e}
    ends = {e["round"]: rounds[e["round"]]["t_end"] + e["duration_s"] for e in events
            if e.get("event") == "forward" and e.get("round") in rounds}
    last: dict[str, int] = {}
    for e in events:
        if e.get("event") == "admitted":
            last[e["rid"]] = max(e["round"], last.get(e["rid"], e["round"]))
    return [r["done_s"] - ends[last[r["server_rid"]]] for r in records
            if r.get("max_new_tokens") == 1 and r.get("done_s") is not None
            and last.get(r.get("server_rid")) in ends]


@dataclass
class Observed:
    """What one or more live runs say of their front end (`observations`, `back_delays`)."""

    questions: list[list[tuple[int, float]]]
    backs: list[float]

    def fit(self, source: str) -> FrontEnd | None:
        return fit(self.questions, source, self.backs)


def arm_observations(arm_dir: Path) -> Observed:
    """What one live arm directory says (requests.jsonl + trace.jsonl; nothing without)."""
    from eval.client import load_trace

    records, events = (load_trace(arm_dir / f) for f in ("requests.jsonl", "trace.jsonl"))
    if not records or not events:
        return Observed([], [])
    return Observed(observations(records, events), back_delays(records, events))


def fit_runs(arm_dirs: Iterable[Path], source: str | None = None) -> FrontEnd | None:
    """`fit` pooled over live arm directories (None where they pin nothing down)."""
    dirs = list(arm_dirs)
    seen = [arm_observations(d) for d in dirs]
    pooled = Observed([q for o in seen for q in o.questions], [b for o in seen for b in o.backs])
    return pooled.fit(source or f"fitted on {len(dirs)} live run(s): "
                      + ", ".join(str(d) for d in dirs[:3]) + (" ..." * (len(dirs) > 3)))


def arm_dirs(roots: Iterable[Path]) -> list[Path]:
    """Every directory under `roots` (or a root itself) with a trace.jsonl and requests.jsonl."""
    return sorted({p.parent for root in roots for p in Path(root).rglob("trace.jsonl")
                   if (p.parent / "requests.jsonl").exists()})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.frontend", description=__doc__.split("\n")[0])
    p.add_argument("roots", nargs="+", type=Path, help="live run directories (searched)")
    args = p.parse_args(argv)
    dirs = arm_dirs(args.roots)
    for d in dirs:
        one = arm_observations(d).fit(str(d))
        print(one.describe() if one else f"{d}: too few clean questions")
    pooled = fit_runs(dirs, f"pooled, {len(dirs)} runs")
    print(pooled.describe() if pooled else "pooled: too few clean questions")
    return 0 if pooled else 1


if __name__ == "__main__":
    raise SystemExit(main())
