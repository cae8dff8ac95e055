"""Host-cost model of the scheduler twin: the scheduler's own CPU time per launched round.

    h(round) = s0 + s1 * visited + s2 * rows + s3 * probed

`visited` counts the requests the scan loop visited (passed its budget check: kit.ScanTiming,
counted by our runtime for our scan and by the kit at the same place for SGLang's own), `rows`
the requests the round runs, `probed` the visits that ran the traversal's probe match (0 for
SGLang's scan; the cost-aware rule skips it where recomputing wins at any ready prefix,
core/traversal.py `recomputes_unprobed`). A scan stops at the first full budget or row limit,
so under load it visits a fraction of the queue (issue 12); the traversal visits further (it
parks Blocked requests and goes on), and each visit costs it the producer-index lookup (a
cached hash-chain walk, at most VERIFY prefix compares) and, for a request a live producer
could block, the wait rule's bound and, unless that bound already says recompute, a probe
match of the radix tree before the native match. Both scans have the same regressors.
The time covers SGLang's prefill scan and batch preparation (`get_next_batch_to_run` with its
`prepare_for_extend`), which is what `Kit.step` times: the kit runs the real scan code, so its
process CPU time per scan is this machine's measurement of that work.

Where it goes (testing/loop.py): a round is ready to launch `h` seconds after its scan; without
overlap that adds to the round, with overlap it hides behind the forward still running (SGLang's
overlap loop scans batch N+1 while batch N computes). A decode step is charged its own scan's
coefficients, `decode`: s0 + s2 * running rows, the arms alike (the scan visits no request),
plus what the arm's scan spent on the requests it visited, if any. Without them (`decode`
None), the arm's `h` with no rows: a prefill scan's fixed time, which includes the prefill's
batch preparation (the kit measures a decode step's scan at about a third of it).

No double count with eval/costmodel.py. Its alpha ("fixed per-forward overhead: launches, the
scheduler's own scan and batch preparation, ...") and gamma (per-row bookkeeping) describe a
round as observed WITHOUT overlap, under SGLang's stock scan. When the host model is on, the
twin charges the GPU `cost - (s0 + s2 * rows)` of the STOCK coefficients (each term at most
the alpha or gamma it comes out of) and the host `h` of the arm's own scan: a stock round
without overlap costs the old `cost` plus `s1 * visited` (plus the measured per-row host time
in excess of gamma, where it exceeds it); a traversal round differs by its own scan's extra
CPU time; with overlap both hide their host time behind the previous forward. Not modelled:
the result processing's CPU time (cache insert, output), also hidden by overlap.

Defaults (DEFAULT_HOST), `python -m eval.hostfit --fit` (eval/hostfit.py `fit`): the paper
workload (mix, qwen3.5-4b, 10 questions per segment, rate 5, all regimes, forward order)
replayed through the kit `repeats` times per scan, stock and radixflow interleaved; the replay
is deterministic, so each launched prefill round recurs in every repeat and its CPU time is the
median over them (a loaded shared machine's stalls drop out). Stock: s0, s1, s2 >= 0 by a
robust (Huber) least-squares fit of those medians on (1, visited, rows). The traversal: stock's
coefficients plus an excess d0, d1, d2 >= 0 fitted the same way on its rounds' residuals over
stock's model, so its scan is never modelled cheaper than stock's on the same visits and rows
(the old unconstrained fit had a negative intercept and charged 1.19 ms per visit against
stock's ~0). They are an assumption about the host, like alpha is about the GPU (measured on
this project's 2-core CPU machine: see DEFAULT_HOST). `measured` uses each scan's measured CPU
time instead (not deterministic: for studies, not for figures). eval/bench_scan.py compares the
scans side by side on synthetic queues (interleaved, medians). Decode steps (the paper
workload generates one token: it has none): gsp at 8 req/s (16 groups x 4, 2,048 + 64 tokens,
16 out, qwen3.5-0.8b, `DECODE_SET`) replayed the same way, stock's decode steps fitted on
(1, running rows). """

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

HOST_CHOICES = ("model", "measured", "none")


@dataclass(frozen=True)
class HostCoef:
    s0: float  # s per launched round
    s1: float  # s per request the scan loop visited
    s2: float  # s per row of the round
    s3: float = 0.0  # s per visit that ran the traversal's probe match

    def __call__(self, queued: int, rows: int, probed: int = 0) -> float:
        return max(0.0, self.s0 + self.s1 * queued + self.s2 * rows + self.s3 * probed)


@dataclass(frozen=True)
class HostCost:
    """Host seconds per launched round, by scan: native (SGLang's) or traversal (ours)."""

    native: HostCoef
    traversal: HostCoef
    measured: bool = False  # use the kit's measured scan CPU time instead
    source: str = "custom"
    # NOTE: a quiet scan (rules quiet_scan, unshared_scan): SGLang's scan plus the boundary
    # publisher's work, the traversal's hooks off; None: charged as the native scan
    quiet: HostCoef | None = None
    # NOTE: a decode step's scan, the arms alike (SGLang's get_next_batch_to_run finding no
    # prefill: the last batch merged, the running batch updated; s0 per step, s2 per running
    # row); None: charged as a prefill scan that admitted nothing (the arm's s0)
    decode: HostCoef | None = None

    def for_policy(self, policy: str) -> HostCoef:
        return self.traversal if _traverses(policy) else self.native

    def host_fn(self, policy: str):
        """(Round, ScanTiming) -> seconds, for testing/loop.py."""
        coef = self.for_policy(policy)
        if self.measured:
            return lambda _rnd, scan: scan.cpu_s

        def host(rnd: Any, scan: Any) -> float:
            # NOTE: a decode step's scan ran too (the arm's own, admitting nothing new); one
            # that visited nothing (an empty queue: SGLang returns before the scan loop) costs
            # SGLang's own fixed time whatever the arm (the traversal's per-round excess is
            # its scan hooks' work; a quiet scan ran SGLang's own code with the hooks off,
            # adapter/quiet.py quiet_rule)
            visited = scan_visited(scan)
            decode = getattr(rnd, "mode", "prefill") == "decode"
            rows = 0 if decode else len(rnd.rids)
            c = coef if visited or rows else self.native
            if getattr(scan, "quiet", False) and c is self.traversal:
                c = self.quiet or self.native
            h = c(visited, rows, getattr(scan, "probed", 0) or 0)
            if decode and self.decode is not None:
                # NOTE: its own scan, plus what the arm's loop spent on the requests it visited
                return self.decode(0, len(rnd.rids)) + max(0.0, h - self.native(0, 0))
            return h

        return host

    def fixed(self, cost: Any, rows: int) -> float:
        """The part of the cost model's alpha + gamma * rows that is host time: the stock scan's
        s0 and s2 * rows, each at most the term it comes out of."""
        s0 = min(max(0.0, self.native.s0), cost.alpha)
        s2 = min(max(0.0, self.native.s2), cost.gamma)
        return s0 + s2 * rows

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def scan_visited(scan: Any) -> int:
    """Requests the scan loop visited (the queue where the kit did not say)."""
    visited = getattr(scan, "visited", None)
    return scan.queued if visited is None else visited


def _traverses(policy: str) -> bool:
    from radixflow_sglang.core.policy import policy_spec

    return bool(policy_spec(policy).traversal)


# NOTE: fitted by `python -m eval.hostfit --fit --repeats 5` (see the module docstring);
# seconds; each coefficient the median of three fits, 2026-12-01 03:41-03:43 UTC, on the shared
# 2-core machine at load average ~1-2, mix/qwen3.5-4b and race/qwen3.5-0.8b pooled, 5
# interleaved repeats each, with quiet scans (core/cost.py `never_waits`: 30 of radixflow's 73
# rounds, fitted apart): stock 0.56-0.73 ms + 0.323-0.343 ms/row; the traversal +0.01-0.15 ms
# per round, +0.09-0.23 ms/row, +0.36-0.47 ms per probe; a quiet scan +0.00-0.01 ms per round,
# +0.01-0.02 ms/visit and row (SGLang's scan and the boundary publisher). The same fit of the
# code without quiet scans, interleaved with those: the traversal +0.19-0.23 ms/row on every
# round. Earlier fits (heavier load, ~12): stock 1.379 ms + 0.486 ms/row, the traversal
# +0.204 ms/row +0.742 ms/probe; absolute times move with the machine's load, the side-by-side
# excess is the finding.
# Decode steps (2026-12-05, the same command on a quiet machine, three fits): 0.121-0.122 ms
# + 0.004-0.0055 ms per running row, where the same fits' prefill scan is 0.302-0.357 ms fixed;
# kept at this default's scale: 0.372 (the median ratio) of its 0.725 ms, and 0.0152 of it per
# row. The old model charged every decode step the prefill scan's fixed 0.725 ms (3-5x the
# measured scan). eval/costmodel.py's fixed 1.5 ms per decode step (DECODE_OVERHEAD_S) is graph
# replay, sampling and the result round trip, not the scan: no double count.
DEFAULT_HOST = HostCost(
    native=HostCoef(s0=0.725e-3, s1=0.0, s2=3.26e-4),
    traversal=HostCoef(s0=0.784e-3, s1=0.0, s2=4.44e-4, s3=4.02e-4),
    source="fit:kit-scan-cpu mix/qwen3.5-4b+race/qwen3.5-0.8b q10 x5 median-of-3 huber "
           "stock+excess>=0 probe-term quiet-apart decode:gsp/qwen3.5-0.8b-ratio",
    quiet=HostCoef(s0=0.731e-3, s1=1.2e-5, s2=3.44e-4),
    decode=HostCoef(s0=0.270e-3, s1=0.0, s2=1.10e-5),
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
    """Round -> GPU seconds: the cost model less its host part (module docstring); all of it
    for a forward-only cost (the simulated executor's: its sleep excludes the scan)."""
    if host is None or getattr(cost, "forward_only", False):
        return lambda rnd: cost.batch(rnd.extend, rnd.prefix)
    return lambda rnd: cost.batch(rnd.extend, rnd.prefix) - host.fixed(cost, len(rnd.rids))
