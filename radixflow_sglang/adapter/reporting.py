"""Reporting: the runtime's decisions counted by reason, for /server_info and Prometheus.

VISIT and DEFER decisions are counted per call (`reasons`, and the scan's own in
`Scan.reasons`); ORDER per request moved or kept, PLACE and PUBLISH per boundary, HOLD per
scheduler pass in the admission hold. Prometheus gets each round's share once (`end_round`).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING, Any

from radixflow_sglang.core.reasons import RULES, Reason, in_rule_order
from radixflow_sglang.core.stats import RoundStats

from .trace import Trace

if TYPE_CHECKING:
    from .admission import AdmissionHold
    from .boundary import Placement


class Reporting:
    """Decision counts, all time; `metrics`: RadixFlowMetrics in a server with
    --enable-metrics (None: no Prometheus)."""

    def __init__(self, trace: Trace, metrics=None,
                 admission: AdmissionHold | None = None) -> None:
        self.trace, self.metrics, self.admission = trace, metrics, admission
        self.reasons: Counter[Reason] = Counter()  # VISIT and DEFER, all time (/server_info)
        self.order_reasons: Counter[Reason] = Counter()  # NOTE: ORDER, per request moved or kept
        self.boundary_reasons: Counter[Reason] = Counter()  # PLACE and PUBLISH, all time
        self._reported: Counter[Reason] = Counter()  # HOLD, PLACE, PUBLISH sent to Prometheus

    def ordered(self, round_: int, why: Reason, waited: int) -> None:
        """An ORDER decision over the `waited` requests it moved first (parked before, or
        published: its case)."""
        self.order_reasons[why] += waited
        if self.trace.on:
            self.trace.emit({"event": "order", "round": round_, "reason": why,
                             "waited": waited})

    def placed(self, round_: int, rid: str, d: Placement | None) -> None:
        """Count the PLACE and PUBLISH rules that decided `rid`'s boundary (`d`: None when
        nothing was asked); trace a `cut` event when a boundary was placed or a no_buffer mark
        set."""
        if d is None:
            return
        self.boundary_reasons[d.placed] += 1
        if d.how is not None:
            self.boundary_reasons[d.how] += 1
        if self.trace.on and (d.how is not None or d.mark is not None):
            why = d.how or d.placed
            self.trace.emit({"event": "cut", "round": round_, "rid": rid, "placed": d.placed,
                             "reason": why, "action": RULES[why].action, "depth": d.depth,
                             "mark": d.mark})

    def end_round(self, s: RoundStats, parked: list[int], scan_reasons: Counter[Reason]) -> None:
        """The round's counters to Prometheus, its `round` event to the trace."""
        if self.metrics is not None:
            self.metrics.on_round(s, parked, s.held)
            if hasattr(self.metrics, "on_reasons"):
                self.metrics.on_reasons(scan_reasons + self._unreported())
        if (s.rows or s.blocked) and self.trace.on:  # NOTE: as_dict is not free
            self.trace.emit({"event": "round", **s.as_dict()})

    def _unreported(self) -> Counter[Reason]:
        """HOLD, ORDER, PLACE and PUBLISH decisions since the last round's report (they are
        counted where they happen, apart from the scan's VISIT and DEFER ones)."""
        now = (self.boundary_reasons + self.order_reasons
               + (self.admission.reasons if self.admission else Counter()))
        fresh, self._reported = now - self._reported, now
        return fresh

    def reason_counts(self) -> dict[str, int]:
        """Visit and defer decisions made so far by reason, in the rulebook's order (their sum
        is the number of decisions: one per `park` and one per `defer` call)."""
        return in_rule_order(self.reasons)

    def hold_reason_counts(self) -> dict[str, int]:
        """The admission hold's decisions so far by reason, in the rulebook's order: one per
        scheduler pass that found fresh requests to hold or release (many passes per round
        while a hold lasts), so they are kept apart from `reasons`."""
        return {} if self.admission is None else in_rule_order(self.admission.reasons)


def summary(rt: Any) -> dict:
    """adapter/runtime.py RadixFlowRuntime's counters for /server_info and metrics (plain
    data)."""
    t, spec, report = rt.totals, rt.spec, rt.report
    return {
        "policy": spec.name, "composition": spec.describe(),
        "wait_rule": (None if rt.traversal is None
                      else "cost-aware" if spec.cost_aware else "always"),
        "recomputed": t.recomputed, "quiet_scans": t.quiet_scans,
        "cost": rt.cost.as_dict(),
        "grid": rt.grid.size, "layout": rt.grid.layout.value,
        "rounds": t.rounds, "blocked": t.blocked, "forks": t.forks,
        "released_by_bound": t.released_by_bound, "parked_max_rounds": t.parked_max_rounds,
        "frag_deferred": t.frag_deferred, "newcomer_deferred": t.newcomer_deferred,
        "scheduled_tokens": t.scheduled_tokens,
        "hit_tokens": t.hit_tokens, "held_iterations": rt.held_iterations,
        "overtakes": rt.admission.overtakes if rt.admission is not None else 0,
        "wait_set": len(rt.traversal.waits) if rt.traversal is not None else 0,
        "records": rt.records.counts(),
        "boundaries": rt.boundary.summary(), "health_checks": rt.health_checks,
        "settings": {**rt.cfg.settings(), "theta": rt.theta},
        "reasons": report.reason_counts(),
        "hold_reasons": report.hold_reason_counts(),
        "order_reasons": in_rule_order(report.order_reasons),
        "boundary_reasons": in_rule_order(report.boundary_reasons),
    }
