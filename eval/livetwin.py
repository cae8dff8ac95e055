"""The `replay` twin of eval/live_ab.py: the twin replays what the live run's client and loop did.

Three things about a live server on this box that the other twins (eval/live_ab.py) miss:

1. Arrivals. bench_serving sends a burst at once, but the requests reach the scheduler over
   ~100 ms (the tokenizer runs on the same cores), so its first scans hold 1, 2, 4 requests,
   not 64. The twin's requests arrive at the live radixflow run's registration stamps (its
   trace's `selected` events, the last N: bench_serving's warm-up request comes first), the
   i-th sent at the i-th stamp. A burst's latency and TTFT are counted from the send (t = 0,
   the first registration), as the client counts them; a paced request's from its arrival.
2. The loop's per-iteration host work the twin leaves out (result processing, streaming to
   the detokenizer; eval/hostcost.py "Not modelled"): h = the live stock runs' median
   inter-token latency minus the twin's median period between two decode launches on the
   same requests, charged on every loop iteration (prefill alpha and decode dec_alpha).
3. The scans' CPU time, with eval/hostcost.py's deterministic `model` (the twin's default):
   without overlap (no_buffer) the traversal's visits are exposed on every prefill round, and
   the live radixflow scans of a burst take 3-12 ms of wall for 20-60 visits.

All come from the live run's own files (trace.jsonl, bench-*.jsonl) and fixed models, so the
prediction is deterministic given them. Nothing is fitted on the ratio it predicts: stamps are
the client's and the tokenizer's, h is read off stock's decode steps.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from eval.bench_arm import read_result
from eval.client import read_jsonl

ARMS = ("stock", "radixflow")


@dataclass(frozen=True)
class LiveFacts:
    """What the twin replays from the live runs."""

    arrivals: tuple[float, ...]  # seconds after the first registration, in registration order
    itl_s: float  # the live stock runs' median inter-token latency
    burst: bool  # every request sent at t = 0

    def note(self, h: float, host=None) -> str:
        return (f"{len(self.arrivals)} arrivals replayed from the live radixflow trace (spread "
                f"{self.arrivals[-1] * 1e3:.0f} ms), loop host h = {h * 1e3:.2f} ms per "
                f"iteration (live stock median ITL {self.itl_s * 1e3:.2f} ms minus the twin's "
                "decode period), scans "
                + ("free" if host is None else f"charged ({host.source})")
                + ("; latencies from the send (t = 0)" if self.burst else ""))


def registrations(trace: Path, n: int) -> tuple[float, ...]:
    """The last `n` requests' registration stamps in `trace`, as offsets from the first of
    them (bench_serving's warm-up request registers before them and is dropped)."""
    stamps = sorted(float(e["registered"]) for e in read_jsonl(trace)
                    if e.get("event") == "selected" and e.get("registered") is not None)
    if len(stamps) < n:
        raise ValueError(f"{trace}: {len(stamps)} selected requests with a registration "
                         f"stamp, the workload sent {n}")
    last = stamps[-n:]
    return tuple(t - last[0] for t in last)


def median_itl_s(run_dirs: Sequence[Path], bench: str) -> float:
    """The median over runs of bench_serving's median_itl_ms (bench-BENCH.jsonl)."""
    vals = [read_result(Path(d) / f"bench-{bench}.jsonl").get("median_itl_ms")
            for d in run_dirs]
    vals = [float(v) for v in vals if v is not None and math.isfinite(v)]
    if not vals:
        raise ValueError(f"no median_itl_ms in bench-{bench}.jsonl of {list(map(str, run_dirs))}")
    return statistics.median(vals) / 1e3


def replay_arrivals(segments, arrivals: Sequence[float]):
    """One open-loop segment whose questions (in send order) arrive at `arrivals`."""
    if len(segments) != 1:
        raise ValueError(f"the live twin replays one segment, got {len(segments)}")
    (seg,) = segments
    if any(q.after is not None for q in seg.questions):
        raise ValueError("the live twin replays open-loop requests only (a question has `after`)")
    if len(seg.questions) != len(arrivals):
        raise ValueError(f"{len(seg.questions)} questions, {len(arrivals)} live arrivals")
    qs = tuple(replace(q, arrival_s=t) for q, t in zip(seg.questions, arrivals, strict=True))
    return [replace(seg, questions=qs)]


def loop_cost(cost, h: float):
    """`cost` with h more per loop iteration, prefill and decode alike."""
    return replace(cost, alpha=cost.alpha + h, dec_alpha=cost.dec_alpha + h,
                   source=f"{cost.source} + live loop host {h * 1e3:.2f} ms/iteration")


def from_send(res, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """`metrics` with latency and TTFT counted from t = 0 (a burst's send), per request."""
    brs = list(res.requests.values())
    lat = np.array([b.completion_s for b in brs], dtype=float)
    ttft = np.array([b.first_token_s for b in brs], dtype=float)
    return dict(metrics, latency_mean_s=float(lat.mean()),
                latency_p95_s=float(np.percentile(lat, 95)),
                latency_p99_s=float(np.percentile(lat, 99)), ttft_mean_s=float(ttft.mean()))


def run_twin(segments, arm: str, model: str, overlap: bool, seed: int, cost, layout: str,
             host=None):
    """One arm's twin ArmResult (raises on a failure: the caller records it)."""
    from eval.twin import run_arm
    from radixflow_sglang.config import RadixFlowConfig

    rf = None if arm == "stock" else RadixFlowConfig(policy=arm)
    res = run_arm(segments, model, arm, layout=layout, overlap=overlap, cost=cost, seed=seed,
                  host=host, radixflow_config=rf)
    if res.error is not None:
        raise RuntimeError(f"{arm} twin failed: {res.error[:500]}")
    return res


def decode_period_s(res) -> float:
    """The median period between two consecutive decode launches with no prefill between
    them: what a client's inter-token latency measures of the loop."""
    starts = sorted([(r.start_s, r.mode) for r in res.rounds]
                    + [(r.start_s, r.mode) for r in res.decode_rounds])
    gaps = [b[0] - a[0] for a, b in zip(starts, starts[1:], strict=False)
            if a[1] == b[1] == "decode"]
    return float(np.median(gaps)) if gaps else 0.0


def predict(segments, facts: LiveFacts, model: str, overlap: bool, seed: int, cost,
            layout: str, keys: Sequence[str], host=None) -> dict[str, Any]:
    """{"arms": {arm: figures}, "h_s": h, "note": ...}: the twin on the live arrivals, first
    with `cost` to read stock's decode period, then with h added per iteration (`host`: an
    eval.hostcost.HostCost charging the scans, in both runs)."""
    segs = replay_arrivals(segments, facts.arrivals)
    plain = run_twin(segs, ARMS[0], model, overlap, seed, cost, layout, host)
    h = max(0.0, facts.itl_s - decode_period_s(plain))
    charged = loop_cost(cost, h)
    arms = {}
    for arm in ARMS:
        res = run_twin(segs, arm, model, overlap, seed, charged, layout, host)
        m = from_send(res, res.metrics) if facts.burst else res.metrics
        arms[arm] = ({"layout": layout, "cost_model": charged.source,
                      "host": None if host is None else host.source}
                     | {k: m.get(k) for k in keys} | {"wall_s": res.wall_s})
    return {"arms": arms, "h_s": h, "note": facts.note(h, host)}


__all__ = ["LiveFacts", "decode_period_s", "from_send", "loop_cost", "median_itl_s", "predict",
           "registrations", "replay_arrivals", "run_twin"]
