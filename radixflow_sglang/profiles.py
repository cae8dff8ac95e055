"""Named cost profiles of the simulated executor (adapter/simulated.py): a prefill round costs
c = alpha + beta * tokens + gamma * rows seconds, a decode step the same with tokens = rows.

* `box` (the default): 5 ms + 2 us/token + 0.1 ms/row, the executor's cost since it was written.
  On a 2-core CPU box SGLang's own host work (scan, batch preparation, result processing, HTTP,
  detokenizer) costs ~20 ms a round, four times this forward: live figures at this profile
  measure mostly host work.
* `paper`: per model, the paper's own rounds (shared/reference/paper-figures.md, Table 9: mean
  host-wrapper ms per nonempty round on A800, Radix and RadixFlow columns, with Table 6's
  tokens and rows per round). How: each model gives two rounds, (c_radix, tokens, rows) and
  (c_radixflow, tokens, rows). Table 9 cannot separate a row's cost from a token's (rows grow
  with tokens), so gamma stays the box's 0.1 ms/row and the two equations
  c_i - gamma * rows_i = alpha + beta * tokens_i are solved exactly for alpha and beta
  (`solve`). Qwen3.5-4B: alpha 50.5 ms, beta 14.5 us/token (the reference's own reading:
  ~50 ms, ~14 us); Qwen3.5-0.8B: 42.6 ms, 7.1 us/token.

RADIXFLOW_SIM_ALPHA / _BETA / _GAMMA (seconds) still override one coefficient each, over either
profile; the source string says so. Engine-free: no SGLang import.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PROFILES = ("box", "paper")
DEFAULT_PROFILE = "box"
PROFILE_VAR = "RADIXFLOW_SIM_PROFILE"
OVERRIDE_VARS = {"alpha": "RADIXFLOW_SIM_ALPHA", "beta": "RADIXFLOW_SIM_BETA",
                 "gamma": "RADIXFLOW_SIM_GAMMA"}
BOX = {"alpha": 0.005, "beta": 2e-6, "gamma": 1e-4}  # s, s/token, s/row
# Table 9 (ms per nonempty round) and Table 6 (tokens, rows per round): model ->
# ((radix ms, tokens, rows), (radixflow ms, tokens, rows)); paper-figures.md verbatim.
TABLE9 = {
    "qwen3.5-0.8b": ((52.95, 1401, 3.63), (54.24, 1575, 4.10)),
    "qwen3.5-4b": ((82.63, 2173, 5.42), (92.95, 2871, 7.31)),
    "qwen3.5-9b": ((112.85, 2739, 6.61), (145.50, 4060, 10.02)),
    "qwen3.5-27b": ((729.94, 3998, 6.51), (1262.95, 7208, 12.11)),
    "nemotron-9b": ((53.06, 2482, 2.91), (53.87, 3701, 4.38)),
    "qwen3-8b": ((26.60, 2328, 4.28), (27.54, 3181, 5.86)),
}


@dataclass(frozen=True)
class SimCost:
    """The coefficients in force and where they come from (for logs, /server_info, reports)."""

    profile: str
    model: str | None
    alpha: float
    beta: float
    gamma: float
    source: str

    def __call__(self, tokens: int, rows: int) -> float:
        return self.alpha + self.beta * tokens + self.gamma * rows

    def as_dict(self) -> dict[str, object]:
        return {"profile": self.profile, "model": self.model, "alpha": self.alpha,
                "beta": self.beta, "gamma": self.gamma, "source": self.source}

    def describe(self) -> str:
        return (f"cost profile {self.profile}: {self.alpha * 1e3:.2f} ms + "
                f"{self.beta * 1e6:.3g} us/token + {self.gamma * 1e3:.3g} ms/row ({self.source})")


def solve(model: str, gamma: float = BOX["gamma"]) -> tuple[float, float]:
    """(alpha, beta) in seconds from the model's two Table 9 rounds, gamma held (docstring)."""
    (c1, t1, r1), (c2, t2, r2) = TABLE9[model]
    y1, y2 = c1 * 1e-3 - gamma * r1, c2 * 1e-3 - gamma * r2
    beta = (y2 - y1) / (t2 - t1)
    return y1 - beta * t1, beta


def check_profile(profile: str, name: str = PROFILE_VAR) -> str:
    if profile not in PROFILES:
        raise ValueError(f"{name}: invalid profile {profile!r} (choose from "
                         f"{', '.join(PROFILES)})")
    return profile


def model_of(model_path: str | Path | None) -> str | None:
    """The catalog name of a served directory (its basename, e.g. model_dirs/qwen3.5-0.8b)."""
    if model_path is None:
        return None
    name = Path(model_path).name
    return name if name in TABLE9 else None


def base(profile: str, model: str | None, name: str = PROFILE_VAR) -> dict[str, float]:
    check_profile(profile, name)
    if profile == "box":
        return dict(BOX)
    if model not in TABLE9:
        raise ValueError(f"{name}: profile paper has no Table 9 row for model {model!r} "
                         f"(rows: {', '.join(TABLE9)}); use profile box or set "
                         f"{', '.join(OVERRIDE_VARS.values())}")
    alpha, beta = solve(model)
    return {"alpha": alpha, "beta": beta, "gamma": BOX["gamma"]}


def resolve(profile: str | None, model: str | None, env: Mapping[str, str] | None = None,
            name: str = PROFILE_VAR) -> SimCost:
    """The profile's coefficients for `model`, each RADIXFLOW_SIM_* variable set in `env`
    overriding its own; errors name `name` (the flag or variable that chose the profile)."""
    profile = profile or DEFAULT_PROFILE
    coef = base(profile, model, name)
    source = "box default" if profile == "box" else f"paper Table 9, {model}"
    over = []
    for key, var in OVERRIDE_VARS.items():
        text = (env or {}).get(var)
        if text:
            try:
                coef[key] = float(text)
            except ValueError:
                raise ValueError(f"{var}: {text!r} is not a number") from None
            over.append(f"{var}={text}")
    if over:
        source += " + " + " ".join(over)
    return SimCost(profile, model, coef["alpha"], coef["beta"], coef["gamma"], source)
