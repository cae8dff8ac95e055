"""Host-cost model of the scheduler twin: the scheduler's own CPU time per launched round.

    h(round) = s0 + s1 * queued + s2 * rows

`queued` counts the requests waiting when the scan began, `rows` the requests the round runs.
For the traversal's scan `queued` is the requests it visited (ScanTiming.visited): its per-
request cost is the probe of each request it visits, and a scan stops at the first full budget
or row limit, so under load it visits a fraction of the queue (mix, qwen3.5-4b, 300 questions,
20 q/s: 13 of 96 queued per round, measured 15 ms per scan). At the fit's load the traversal
visited every queued request (43 rounds: visited == queued in each), so the coefficients
below are per visited request; charged per queued request they extrapolated to ~0.1-0.5 s per
scan under overload, 30x the kit's measured scan time (issue 12).
The time covers SGLang's prefill scan and batch preparation (`get_new_batch_prefill` with its
`prepare_for_extend`), which is what `Kit.step` times: the kit runs the real scan code, so its
process CPU time per scan is this machine's measurement of that work. Coefficients differ by
scan: SGLang's stock scan stops at the first full budget, the state-ready traversal visits the
queue further (eval/bench_scan.py compares the two).

Where it goes (testing/loop.py): a round is ready to launch `h` seconds after its scan; without
overlap that adds to the round, with overlap it hides behind the forward still running (SGLang's
overlap loop scans batch N+1 while batch N computes).

No double count with eval/costmodel.py. Its alpha ("fixed per-forward overhead: launches, the
scheduler's own scan and batch preparation, ...") and gamma (per-row bookkeeping) describe a
round as observed WITHOUT overlap, under SGLang's stock scan. When the host model is on, the
twin charges the GPU `cost - (s0 + s2 * rows)` of the STOCK coefficients (each term at most
the alpha or gamma it comes out of) and the host `h` of the arm's own scan: a stock round
without overlap costs the old `cost` plus `s1 * queued` (plus the measured per-row host time
in excess of gamma, where it exceeds it); a traversal round differs by its own scan's extra
CPU time; with overlap both hide their host time behind the previous forward. Not modelled:
the result processing's CPU time (cache insert, output), also hidden by overlap.

Defaults (DEFAULT_HOST): least-squares fit of the kit's measured scan CPU time per launched
round against (queued, rows), on the paper workload (mix, qwen3.5-4b, 10 questions per segment,
rate 5, all regimes, forward order; `python -m eval.hostcost --fit`), on this project's 2-core
CPU machine. They are an assumption about the host, like alpha is about the GPU. `measured`
uses each scan's measured CPU time instead (not deterministic: for studies, not for figures).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, replace
from typing import Any

HOST_CHOICES = ("model", "measured", "none")


@dataclass(frozen=True)
class HostCoef:
    s0: float  # s per launched round
    s1: float  # s per queued request at the scan (the traversal: per visited request)
    s2: float  # s per row of the round

    def __call__(self, queued: int, rows: int) -> float:
        return max(0.0, self.s0 + self.s1 * queued + self.s2 * rows)


@dataclass(frozen=True)
class HostCost:
    """Host seconds per launched round, by scan: native (SGLang's) or traversal (ours)."""

    native: HostCoef
    traversal: HostCoef
    measured: bool = False  # use the kit's measured scan CPU time instead
    source: str = "custom"

    def for_policy(self, policy: str) -> HostCoef:
        return self.traversal if _traverses(policy) else self.native

    def host_fn(self, policy: str):
        """(Round, ScanTiming) -> seconds, for testing/loop.py."""
        coef = self.for_policy(policy)
        if self.measured:
            return lambda _rnd, scan: scan.cpu_s

        def host(rnd: Any, scan: Any) -> float:
            if getattr(rnd, "mode", "prefill") != "prefill":
                # NOTE: a decode step runs SGLang's own path (update_running_batch) under every
                # policy: the stock coefficients (the traversal fit's intercept is below 0, so
                # its decode steps were free while stock's cost 1.5 ms)
                return self.native(scan.queued, len(rnd.rids))
            queued = _visited(scan) if coef is self.traversal else scan.queued
            return coef(queued, len(rnd.rids))

        return host

    def fixed(self, cost: Any, rows: int) -> float:
        """The part of the cost model's alpha + gamma * rows that is host time: the stock scan's
        s0 and s2 * rows, each at most the term it comes out of."""
        s0 = min(max(0.0, self.native.s0), cost.alpha)
        s2 = min(max(0.0, self.native.s2), cost.gamma)
        return s0 + s2 * rows

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _visited(scan: Any) -> int:
    """Requests the traversal's scan visited (the queue where the kit did not say)."""
    visited = getattr(scan, "visited", None)
    return scan.queued if visited is None else visited


def _traverses(policy: str) -> bool:
    from radixflow_sglang.core.policy import policy_spec

    return bool(policy_spec(policy).traversal)


# NOTE: fitted by `python -m eval.hostcost --fit` (see the module docstring); seconds.
# Measured 2026-11-30 on the shared 2-core machine under load (33 stock rounds: mean 2.84 ms per
# scan; 48 radixflow rounds: mean 5.02 ms); the traversal's per-queued term is its prefix match
# of every waiting request.
DEFAULT_HOST = HostCost(
    native=HostCoef(s0=1.50e-3, s1=-4.87e-7, s2=3.40e-4),
    traversal=HostCoef(s0=-1.54e-4, s1=1.19e-3, s2=2.15e-4),
    source="fit:kit-scan-cpu mix qwen3.5-4b q10",
)


def host_model(kind: str, base: HostCost = DEFAULT_HOST) -> HostCost | None:
    """`model` (the deterministic default), `measured`, or `none` (free scans: the old twin)."""
    if kind not in HOST_CHOICES:
        raise ValueError(f"--host-cost: invalid choice {kind!r} (choose from "
                         f"{', '.join(HOST_CHOICES)})")
    if kind == "none":
        return None
    if kind == "measured":
        return replace(base, measured=True, source="measured:kit-scan-cpu")
    return base


def gpu_cost(cost: Any, host: HostCost | None):
    """Round -> GPU seconds: the cost model less its host part (module docstring)."""
    if host is None:
        return lambda rnd: cost.batch(rnd.extend, rnd.prefix)
    return lambda rnd: cost.batch(rnd.extend, rnd.prefix) - host.fixed(cost, len(rnd.rids))


def fit(model: str = "qwen3.5-4b", questions: int = 10, data_dir: str | None = None
        ) -> HostCost:
    """Fit both scans' coefficients from the kit's measured scan CPU time on the workload."""
    import numpy as np

    from eval import twin
    from eval.workload import workload

    segs = workload("mix", model, regime="all", order="forward", questions=questions,
                    rate=5.0, seed=0, data_dir=data_dir)
    coefs = {}
    for kind, policy in (("native", "stock"), ("traversal", "radixflow")):
        rec: list[tuple[int, int, float]] = []

        def record(rnd: Any, scan: Any, rec: list = rec, kind: str = kind) -> float:
            n = _visited(scan) if kind == "traversal" else scan.queued
            rec.append((n, len(rnd.rids), scan.cpu_s))
            return 0.0

        twin.replay(segs, model, policy, host=record)
        a = np.array(rec, dtype=float)
        x = np.column_stack([np.ones(len(a)), a[:, 0], a[:, 1]])
        c, *_ = np.linalg.lstsq(x, a[:, 2], rcond=None)
        coefs[kind] = HostCoef(*(float(v) for v in c))
    return HostCost(coefs["native"], coefs["traversal"],
                    source=f"fit:kit-scan-cpu mix {model} q{questions}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.hostcost", description=__doc__.split("\n")[0])
    p.add_argument("--fit", action="store_true", help="measure and print fitted coefficients")
    p.add_argument("--questions", type=int, default=10)
    p.add_argument("--data-dir", default=None)
    a = p.parse_args(argv)
    h = fit(questions=a.questions, data_dir=a.data_dir) if a.fit else DEFAULT_HOST
    print(json.dumps(h.as_dict(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
