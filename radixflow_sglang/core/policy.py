"""Named policies (the paper's Table 1 rows) and what each one is composed of."""

from __future__ import annotations

from dataclasses import dataclass

from .admission import HOLD_MS, RENEWED

POLICIES = (
    "stock", "radix", "timer5", "timer10", "flex", "traversal", "radixflow", "radixflow-frag",
    "traversal-always", "radixflow-always", "flex-always",
)


@dataclass(frozen=True)
class PolicySpec:
    name: str
    native_class: bool  # stock: SGLang's unmodified scheduler class
    traversal: bool  # state-ready traversal + fork-point publication
    admission: str | None  # None | "flex" (early release rules) | "timer" (deadline or rows only)
    admission_ms: float  # hold at most this long
    frag: bool  # fragmentation guard
    cost_aware: bool = False  # a Blocked request waits only when waiting wins (core/cost.py)
    hold_cost: bool = False  # flex holds only while holding wins (core/admission.py)

    def describe(self) -> str:
        parts = ["SGLang's unmodified scheduler" if self.native_class else "native selection"]
        if self.admission == "timer":
            parts.append(f"timer hold {self.admission_ms:g} ms (deadline or full rows)")
        elif self.admission == "flex":
            ms = self.admission_ms
            # NOTE: cost-aware, the bound runs from the held burst's newest arrival (Gate.wait_left)
            bound = (f"<= {ms:g} ms after its burst last grew, {RENEWED * ms:g} ms in all"
                     if self.hold_cost else f"<= {ms:g} ms")
            rule = "cost-aware hold" if self.hold_cost else "always hold"
            parts.append(f"flexible admission ({bound}, early release, {rule})")
        if self.traversal:
            rule = ("cost-aware wait: park only when waiting adds less latency than recomputing"
                    if self.cost_aware else "always wait: park every Blocked request")
            parts.append(f"state-ready traversal ({rule}) + fork-point publication")
        if self.frag:
            parts.append("fragmentation guard")
        return " + ".join(parts)


ADMISSION_MS_RANGE = (0.0, 1000.0)  # the flexible hold's bound (ms) a user may set


def policy_spec(name: str, admission_ms: float | None = None) -> PolicySpec:
    # NOTE: neutral errors; radixflow_sglang/config.py names the flag or variable the user set
    if name not in POLICIES:
        raise ValueError(f"invalid policy {name!r} (choose from {', '.join(POLICIES)})")
    low, high = ADMISSION_MS_RANGE
    if admission_ms is not None and not low <= admission_ms <= high:
        raise ValueError(f"admission_ms {admission_ms} is outside [{low:g}, {high:g}]")
    flex_ms = HOLD_MS if admission_ms is None else admission_ms
    table = {
        "stock": (True, False, None, 0.0, False),
        "radix": (False, False, None, 0.0, False),
        "timer5": (False, False, "timer", 5.0, False),
        "timer10": (False, False, "timer", 10.0, False),
        "flex": (False, False, "flex", flex_ms, False, False, True),
        "traversal": (False, True, None, 0.0, False, True),
        "radixflow": (False, True, "flex", flex_ms, False, True, True),
        "radixflow-frag": (False, True, "flex", flex_ms, True, True, True),
        "traversal-always": (False, True, None, 0.0, False, False),
        "radixflow-always": (False, True, "flex", flex_ms, False, False, False),
        "flex-always": (False, False, "flex", flex_ms, False, False, False),
    }
    return PolicySpec(name, *table[name])
