"""Prometheus metrics for RadixFlow, created inside the scheduler process.

SGLang sets PROMETHEUS_MULTIPROC_DIR before spawning schedulers when `--enable-metrics` is on,
and `/metrics` aggregates every process's samples. Only the stats-logging rank records
(`SchedulerMetricsReporter.is_stats_logging_rank`), so a TP group counts each round once.
"""

from __future__ import annotations

from radixflow_sglang.core.cost import CostCoeffs
from radixflow_sglang.core.reasons import RULES
from radixflow_sglang.core.stats import RoundStats

ROW_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)
TOKEN_BUCKETS = (0, 64, 256, 1024, 2048, 4096, 8192, 16384)
FORWARD_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class RadixFlowMetrics:
    def __init__(self, policy: str, labels: dict[str, str] | None = None) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self.labels = {"policy": policy, **(labels or {})}
        names = list(self.labels)
        self.rounds = Counter("radixflow_rounds", "Prefill rounds scheduled", names)
        self.blocked = Counter("radixflow_blocked", "Consumers parked (Blocked visits)", names)
        self.forks = Counter("radixflow_forks", "Producers moved to publish at a fork", names)
        self.held = Counter("radixflow_held_iterations", "Iterations held by admission", names)
        self.rows = Histogram("radixflow_round_rows", "Requests per round", names,
                              buckets=ROW_BUCKETS)
        self.tokens = Histogram("radixflow_round_tokens", "Scheduled tokens per round", names,
                                buckets=TOKEN_BUCKETS)
        self.parked = Histogram("radixflow_parked_rounds", "Rounds a request waited parked",
                                names, buckets=(0, 1, 2, 3, 4, 8))
        self.wait_set = Gauge("radixflow_wait_set", "Parked requests now", names,
                              multiprocess_mode="mostrecent")
        self.recomputed = Counter("radixflow_recomputed",
                                  "Blocked requests the cost rule sent to recompute", names)
        self.quiet = Counter("radixflow_quiet_scans",
                             "Scans in which no request could wait (traversal hooks off)", names)
        self.quiet.labels(**self.labels)  # NOTE: exported from the start, 0 until one runs
        self.newcomers = Counter("radixflow_newcomer_deferred", "Requests kept out of a "
                                 "released consumer's round (cost rule)", names)
        self.newcomers.labels(**self.labels)  # NOTE: exported from the start, like quiet
        self.decisions = Counter("radixflow_decisions", "Decisions by the rule that made them "
                                 "and its decision point (core/reasons.py RULEBOOK)",
                                 [*names, "point", "reason"])
        for counter in (self.rounds, self.blocked, self.forks, self.held, self.recomputed):
            counter.labels(**self.labels)  # NOTE: every README series exists before its event
        self.forward = Histogram("radixflow_forward_seconds", "Measured prefill forward time",
                                 names, buckets=FORWARD_BUCKETS)
        self.fit = Gauge("radixflow_round_cost", "Round-cost fit: c = alpha + beta * tokens + "
                         "gamma * rows + delta * pairs (seconds per unit)",
                         [*names, "term"], multiprocess_mode="mostrecent")

    def on_round(self, s: RoundStats, parked_rounds: list[int], held: int) -> None:
        lab = self.labels
        if s.rows:
            self.rounds.labels(**lab).inc()
            self.rows.labels(**lab).observe(s.rows)
            self.tokens.labels(**lab).observe(s.scheduled_tokens)
        self.blocked.labels(**lab).inc(s.blocked)
        self.forks.labels(**lab).inc(s.forks)
        if held:
            self.held.labels(**lab).inc(held)
        for n in parked_rounds:
            self.parked.labels(**lab).observe(n)
        self.wait_set.labels(**lab).set(s.wait_set)
        if s.recomputed:
            self.recomputed.labels(**lab).inc(s.recomputed)
        if s.quiet:
            self.quiet.labels(**lab).inc()
        if s.newcomer_deferred:
            self.newcomers.labels(**lab).inc(s.newcomer_deferred)

    def on_reasons(self, counts) -> None:
        """Decisions by reason (a Counter of core/reasons.py Reason), any decision point."""
        for reason, n in counts.items():
            if n:
                self.decisions.labels(**self.labels, point=RULES[reason].point,
                                      reason=str(reason)).inc(n)

    def on_forward(self, seconds: float, fit: CostCoeffs) -> None:
        lab = self.labels
        if seconds == seconds:  # NOTE: NaN = not measured
            self.forward.labels(**lab).observe(seconds)
        for term in ("alpha", "beta", "gamma", "delta"):
            self.fit.labels(**lab, term=term).set(getattr(fit, term))


def dp_rank_of(_sched=None) -> int | None:
    """This scheduler process's data-parallel rank; None without DP or outside a server.

    NOTE: SGLang 0.5.23's Scheduler has no `dp_rank` attribute; the rank lives in
    runtime_context's ParallelContext (`dp_rank`: the DP controller's replica rank, None
    without DP; `attn_dp_rank` under DP attention)."""
    try:
        from sglang.srt.runtime_context import get_parallel

        p = get_parallel()
        if p.dp_rank is not None:
            return p.dp_rank
        return p.attn_dp_rank if p.attn_dp_size > 1 else None
    except (AttributeError, RuntimeError, ValueError):  # NOTE: no published parallel context
        return None


def scheduler_metrics(sched, policy: str) -> RadixFlowMetrics | None:
    rep = getattr(sched, "metrics_reporter", None)
    if rep is None or not rep.enable_metrics or not rep.is_stats_logging_rank:
        return None
    return RadixFlowMetrics(policy, {"dp_rank": str(dp_rank_of(sched) or 0)})
