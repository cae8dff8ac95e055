"""The live server's front end in the twin: when each branch of a question reaches the scheduler.

A live client sends a question's branches at once; SGLang's HTTP server and tokenizer manager
hand them to the scheduler one after another, a few ms later (docs/notes/2026-12-live-two-
profiles.md, section 5). The model: branch j of a question (branch order) becomes visible at

    arrival + c + sum over branches k <= j of (a + b * tokens_k)

c: per question (HTTP, the event loops, ZMQ, the scheduler's next pass), a + b * tokens: per
branch, in turn (the tokenizer manager takes them one at a time; a longer prompt takes longer to
parse and to pass on). Latency still counts from the arrival, as the live client counts it
from the send.

`fit_runs` fits c, a, b by least squares on live runs: per question, its branches' `registered`
stamps (the trace's `selected` events) in registration order against the question's send
(`q_send_s` in the client's requests.jsonl), only where no forward ran between the send and the
last registration (a forward holds the loop, and the twin already charges that wait).

`python -m eval.frontend DIR...`: the fit over every arm directory under DIR with both files.
"""

from __future__ import annotations

import argparse
import math
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
    questions: int = 0  # questions the fit read (0: not fitted)
    resid_s: float | None = None  # the fit's residual standard deviation

    def offsets(self, lengths: Sequence[int]) -> list[float]:
        """Each branch's delay after the question's arrival (branch order)."""
        out, t = [], self.c_s
        for n in lengths:
            t += self.a_s + self.b_s * n
            out.append(t)
        return out

    def describe(self) -> str:
        fit = "" if self.resid_s is None else (
            f"; {self.questions} questions, residual sd {self.resid_s * 1e3:.2f} ms")
        return (f"front end {self.c_s * 1e3:.2f} ms a question + {self.a_s * 1e3:.3f} ms + "
                f"{self.b_s * 1e6:.3f} us/token a branch, in turn ({self.source}{fit})")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"c_ms": self.c_s * 1e3, "a_ms": self.a_s * 1e3,
                               "b_us_per_token": self.b_s * 1e6}


# NOTE: `python -m eval.frontend out/ab51-xb/profile-box/paper out/ab51-xb/profile-paper/paper
# out/ab52-box-xb/paper out/ab52-paper-xb/paper`: 12 quiet live radixflow runs of paper mix
# (24 questions x 6 segments, qwen3.5-0.8b, the 2-core box), both profiles; per run c 4.0-4.7
# ms, a 0.34-0.70 ms, b 0.29-0.44 us/token, residual sd 1.3-1.8 ms
FITTED = FrontEnd(4.43e-3, 0.466e-3, 0.353e-6,
                  "fitted: live paper mix, ab51-xb + ab52-{box,paper}-xb, 12 runs",
                  questions=837, resid_s=1.58e-3)


def parse(text: str) -> FrontEnd | None:
    """--front-end: `off` (None), `fitted` (FITTED) or `C_MS,A_MS,B_US` (per question ms, per
    branch ms, per token us)."""
    if text == "off":
        return None
    if text == "fitted":
        return FITTED
    parts = text.split(",")
    try:
        c, a, b = (float(x) for x in parts)
    except ValueError:
        raise ValueError(f"front end {text!r}: off, fitted, or C_MS,A_MS,B_US "
                         "(three numbers)") from None
    if min(c, a, b) < 0 or not all(map(math.isfinite, (c, a, b))):
        raise ValueError(f"front end {text!r}: every term must be a finite number >= 0")
    return FrontEnd(c / 1e3, a / 1e3, b / 1e6, f"given: {text}")


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
    return fit(arm_observations(arm_dir), f"fitted on the live run {arm_dir}")


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


def fit(obs: Sequence[Sequence[tuple[int, float]]], source: str) -> FrontEnd | None:
    """Least squares of t_i = c + (i + 1) a + b * (tokens of branches 0..i), over every
    question's i-th registration. With one branch per question c and a are one term (a = 0);
    with one length, b is (b = 0). Negative terms are 0. None: under MIN_QUESTIONS."""
    import numpy as np

    if len(obs) < MIN_QUESTIONS:
        return None
    rows, ys = [], []
    for q in obs:
        cum = 0
        for i, (n, t) in enumerate(q):
            cum += n
            rows.append([1.0, i + 1.0, float(cum)])
            ys.append(t)
    x, y = np.array(rows), np.array(ys)
    for cols in ([0, 1, 2], [0, 2], [0]):  # NOTE: drop what the data cannot tell apart
        coef, _, rank, _ = np.linalg.lstsq(x[:, cols], y, rcond=None)
        if rank == len(cols):
            break
    got = dict(zip(cols, coef, strict=True))
    terms = [max(0.0, float(got.get(i, 0.0))) for i in range(3)]  # NOTE: a delay is >= 0
    resid = y - x @ np.array(terms)
    return FrontEnd(*terms, source, questions=len(obs), resid_s=float(resid.std()))


def arm_observations(arm_dir: Path) -> list[list[tuple[int, float]]]:
    """`observations` of one live arm directory (requests.jsonl + trace.jsonl; [] without)."""
    from eval.client import load_trace

    records, events = (load_trace(arm_dir / f) for f in ("requests.jsonl", "trace.jsonl"))
    return observations(records, events) if records and events else []


def fit_runs(arm_dirs: Iterable[Path], source: str | None = None) -> FrontEnd | None:
    """`fit` pooled over live arm directories (None where they pin nothing down)."""
    dirs = list(arm_dirs)
    obs = [q for d in dirs for q in arm_observations(d)]
    return fit(obs, source or f"fitted on {len(dirs)} live run(s): "
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
        one = fit(arm_observations(d), str(d))
        print(one.describe() if one else f"{d}: too few clean questions")
    pooled = fit_runs(dirs, f"pooled, {len(dirs)} runs")
    print(pooled.describe() if pooled else "pooled: too few clean questions")
    return 0 if pooled else 1


if __name__ == "__main__":
    raise SystemExit(main())
