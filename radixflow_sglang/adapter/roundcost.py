"""RoundCost: what a prefill round costs, learnt from the forwards every rank agrees on.

The round-cost fit (core/cost.py RoundCostEstimator), the host time and launch periods fed to
it, and the cost-aware rule's arrival rate and agreed clock, which ride the forward's
broadcast. Lives across scans; the runtime prices decisions with `fit`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from radixflow_sglang.core.admission import ArrivalRate
from radixflow_sglang.core.cost import CostCoeffs, LaunchPeriods, RoundCostEstimator

from .agreement import local_share
from .trace import Trace

if TYPE_CHECKING:
    from radixflow_sglang.config import RadixFlowConfig


class RoundCost:
    """`rated`: the cost-aware rule runs (it reads the arrival rate and the agreed clock);
    `lag`: the traversal's publish lag (overlap hides host time behind the forward);
    `cfg`'s pins: `round_overhead_ms` (--radixflow-round-overhead-ms), the fit's wall
    overhead; `arrival_rate` (--radixflow-arrival-rate), the rate the wait rule reads."""

    def __init__(self, prior: CostCoeffs, cfg: RadixFlowConfig, *, rated: bool, lag: int,
                 clock: Callable[[], float], trace: Trace, metrics=None) -> None:
        self.overhead_ms, self.rated, self.lag = cfg.round_overhead_ms, rated, lag
        self.pinned_rate = cfg.arrival_rate
        self.clock, self.trace, self.metrics = clock, trace, metrics
        self.fit = self._estimator(prior)
        # NOTE: a server's loop feeds its launches (adapter/scheduler.py); the kit feeds none
        self.periods = LaunchPeriods()
        # NOTE: this pass's time from the loop's last launch or processed result (traced in the
        # round event, never decided on: adapter/scheduler.py sets it, None where unknown)
        self.pass_s: float | None = None
        self.share_forward = local_share  # NOTE: a server broadcasts rank 0's values
        self.arrivals = ArrivalRate()  # NOTE: new waiting-queue entries, this rank's clock
        self.arrival_rate = 0.0  # rank 0's, agreed with each prefill forward (the wait rule)
        self.agreed_now = 0.0  # rank 0's clock at the last prefill forward (request stamps)
        self._queued: set[str] = set()

    def use_prior(self, prior) -> None:
        """Restart the fit from `prior` (anything with alpha/beta/gamma[/delta])."""
        self.fit = self._estimator(CostCoeffs(
            prior.alpha, prior.beta, prior.gamma, getattr(prior, "delta", 0.0),
            getattr(prior, "source", "custom")))

    def _estimator(self, prior: CostCoeffs) -> RoundCostEstimator:
        ms = self.overhead_ms
        return RoundCostEstimator(prior, wall=None if ms is None else ms / 1e3)

    def host_s(self) -> float:
        """Host time the wait rule adds to a round beside the coefficients': none once the
        round's wall period is measured (it is in their fixed cost then, overlap included);
        else the measured scan time, only without overlap (it hides behind the forward)."""
        if self.fit.measures_wall or self.lag > 1:
            return 0.0
        return self.fit.host_s

    def idle_wait_s(self) -> float | None:
        """What a wait that launches nothing adds (core/cost.py RoundView.idle_wait_s): the
        measured pass from a result to the next launch; before any, the scan's host time where
        it is fed (the twin, a GPU server); else None (the wait is priced as a round)."""
        resume = self.fit.resume_s
        if resume is not None:
            return resume
        return self.fit.host_s if self.fit.host_fed else None

    def count_arrivals(self, rids: Iterable[str]) -> None:
        """Requests that entered the waiting queue since the last scan (a retracted one
        re-enters: work arriving all the same), for the arrival rate the wait rule reads."""
        queued = set(rids)
        now = self.clock()
        for _ in range(len(queued - self._queued)):
            self.arrivals.add(now, 0)
        self._queued = queued

    def observe_forward(self, round_: int, rows: int, tokens: int, seconds: float,
                        host: float | None = None,
                        period: tuple[float, float, float] | None = None, **extra) -> float:
        """One prefill forward's measured duration in round `round_`: agreed across ranks
        (rank 0's value), recorded in the trace, fed to the fit. Every rank must call it for
        every prefill forward in the same order (it runs a collective in a server). `host`:
        the round's scheduler CPU time, agreed in the same broadcast and fed as `observe_host`
        (None on every rank, or on none). The cost-aware rule's arrival rate (a clock reading)
        rides the same broadcast. `extra`: `pairs` (full-attention query-key pairs, fitted as
        a term) and anything worth tracing. `period`: the previous prefill round's wall period
        (LaunchPeriods; NaN: unknown) and that round's forward as the loop's wall saw it,
        agreed in the same broadcast and fed to the wall overhead every decision prices a
        round with, and its period across a pass that waited for a result (NaN: none; fed as
        `observe_resume`) (None on every rank, or on none: the kit feeds none)."""
        values = (seconds,) + (() if host is None else (host,)) + (period or ())
        if self.rated:
            now = self.clock()
            rate = self.arrivals.rate(now) if self.pinned_rate is None else self.pinned_rate
            values += (now, rate)
        agreed = iter(self.share_forward(*values))
        seconds = float(next(agreed))
        if host is not None:
            self.fit.observe_host(float(next(agreed)))
        if period is not None:
            extra |= self._observe_period(*(float(next(agreed)) for _ in range(3)))
        if self.rated:
            self.agreed_now, self.arrival_rate = (float(v) for v in agreed)
        pairs = float(extra.get("pairs", 0.0))
        accepted = self.fit.observe(rows, tokens, seconds, pairs)
        self.trace.emit({"event": "forward", "round": round_, "rows": rows,
                         "scheduled_tokens": tokens, "duration_s": seconds,
                         "accepted": accepted, **extra})
        self.trace.flush()
        if self.metrics is not None and hasattr(self.metrics, "on_forward"):
            self.metrics.on_forward(seconds, self.fit.coeffs)
        return seconds

    def _observe_period(self, p: float, f: float, r: float) -> dict:
        """Feed the agreed period, its forward and its period across a waiting pass (NaN:
        unknown); return what the forward event traces of them."""
        self.fit.observe_period(p, f)
        self.fit.observe_resume(r, f)
        # NOTE: an unknown period (NaN) is traced as null (adapter/trace.py)
        out = {"period_s": p, "period_forward_s": f,
               "wall_s": self.fit.wall_s}  # NOTE: what decisions add to a round now
        if math.isfinite(r):
            out["resumed_period_s"] = r
        return out

    def observe_host(self, seconds: float) -> float:
        """One prefill round's scheduler CPU time (scan + batch preparation): agreed across
        ranks like a forward (every rank calls it for the same rounds, in order), fed to the
        host-time estimate the wait rule adds to a round without overlap."""
        seconds = float(self.share_forward(seconds)[0])
        self.fit.observe_host(seconds)
        return seconds
