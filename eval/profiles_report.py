"""One command's cost profiles side by side (eval/run_arms.py --profiles): per profile and arm,
the live ratio to stock and the twin's prediction of it, from each profile's summary.json.

OUT/profiles.md and OUT/profiles.json; each profile's own report is OUT/profile-NAME/report.md.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

BASELINE = "stock"
KEYS = (("mean", "latency_mean_s"), ("p99", "latency_p99_s"), ("tokens", "scheduled_tokens"))


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, int | float) and isinstance(b, int | float) and b else None


def arm_rows(summary: Mapping[str, Any]) -> dict[str, dict[str, float | None]]:
    """arm -> {live_mean, twin_mean, gap_mean, live_p99, ...}: ratios to the stock arm (live:
    the live stock's figure; twin: the twin's stock); None where either is missing."""
    arms = summary.get("arms") or {}
    base = arms.get(BASELINE) or {}
    base_twin = base.get("twin") or {}
    out = {}
    for name, m in arms.items():
        if m.get("failed"):
            out[name] = {"failed": m.get("error")}
            continue
        twin = m.get("twin") or {}
        row: dict[str, float | None] = {}
        for label, key in KEYS:
            live, pred = _ratio(m.get(key), base.get(key)), _ratio(twin.get(key),
                                                                 base_twin.get(key))
            row[f"live_{label}"], row[f"twin_{label}"] = live, pred
            row[f"gap_{label}"] = (abs(pred - live) if live is not None and pred is not None
                                   else None)
        out[name] = row
    return out


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def render(per_profile: Mapping[str, Mapping[str, Any]]) -> str:
    lines = ["# Live arms at each cost profile", "",
             "Ratios to the stock arm of the same profile: live (this command's servers) and the "
             "twin's prediction (eval/twin.py at the same profile, its host model as the "
             "profile's report.md says). Latency = question mean / p99; tokens = scheduled "
             "prefill tokens.", "",
             "| profile | cost | arm | live mean | twin mean | \\|gap\\| | live p99 | twin p99 "
             "| live tokens | twin tokens |", "|" + "---|" * 10]
    for prof, summary in per_profile.items():
        cost = (summary.get("config") or {}).get("sim_cost") or {}
        what = (f"{cost['alpha'] * 1e3:.2f} ms + {cost['beta'] * 1e6:.3g} us/tok"
                if cost else "-")
        for arm, r in arm_rows(summary).items():
            if "failed" in r:
                lines.append(f"| {prof} | {what} | {arm} | FAILED: {str(r['failed'])[:120]} "
                             "|||||||")
                continue
            cells = [r["live_mean"], r["twin_mean"], r["gap_mean"], r["live_p99"],
                     r["twin_p99"], r["live_tokens"], r["twin_tokens"]]
            lines.append(f"| {prof} | {what} | {arm} | " + " | ".join(map(_f, cells)) + " |")
    return "\n".join(lines) + "\n"


def write_profiles(out: Path, per_profile: Mapping[str, Mapping[str, Any]]) -> None:
    rows = {p: {"sim_cost": (s.get("config") or {}).get("sim_cost"), "arms": arm_rows(s)}
            for p, s in per_profile.items()}
    (out / "profiles.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "profiles.md").write_text(render(per_profile))
