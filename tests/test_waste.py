"""eval/waste.py: scheduled tokens beyond the oracle, split by cause, on real twin replays."""

from __future__ import annotations

import pytest

from eval import waste
from eval.costmodel import cost_with
from eval.twin import run_arm
from eval.workload import Branch, Question, Segment, arrange, offered_trace, synthetic
from radixflow_sglang.geometry import load_geometry

MODEL = "qwen3.5-0.8b"


def _replay(segs, policy):
    res = run_arm(segs, MODEL, policy, cost=cost_with(MODEL))
    assert res.ok, res.error
    return res, waste.breakdown(segs, res, load_geometry(MODEL).grid)


@pytest.fixture(scope="module")
def burst():
    """Synthetic four-branch questions, all at once: siblings meet in the same scans."""
    qs = synthetic(6, profile="mix", seed=2)
    segs = [Segment("cold", "forward",
                    tuple(offered_trace(arrange(qs, "cold", tag="w"), rate=1e6, seed=2)))]
    return segs, {p: _replay(segs, p) for p in ("stock", "radixflow-always")}


@pytest.mark.parametrize("policy", ["stock", "radixflow-always"])
def test_the_split_is_exact_and_its_oracle_is_the_twins(burst, policy) -> None:
    _, arms = burst
    res, parts = arms[policy]
    assert waste.check(parts)
    assert parts["scheduled"] == res.metrics["scheduled_tokens"]
    assert parts["unique"] == res.metrics["unique_tokens"]
    assert parts["grid"] >= 0 and parts["reprefill"] == 0


def test_stock_recomputes_siblings_beside_their_producer_and_radixflow_does_not(burst) -> None:
    _, arms = burst
    stock, rf = arms["stock"][1], arms["radixflow-always"][1]
    assert stock["same_round"] > 0.5 * stock["unique"]  # three siblings per question
    assert rf["same_round"] < 0.1 * stock["same_round"]
    assert rf["scheduled"] < stock["scheduled"]


def test_a_sibling_after_its_producer_is_judged_against_the_grid_floor() -> None:
    """Two requests sharing 200 tokens, the second sent long after the first finished: the
    oracle reuses 200 tokens; the grid keeps 192 (G 64) of them; what the cache really served
    is later_short's (negative when more than the floor)."""
    shared = list(range(1000, 1200))
    a = Branch("t/a", shared + [7] * 40, "t", 0)
    b = Branch("t/b", shared + [9] * 40, "t", 0)
    segs = [Segment("cold", "forward", (Question("a", "d", (a,), 200, 200, None, 0.0),
                                        Question("b", "d", (b,), 200, 200, None, 5.0)))]
    res, parts = _replay(segs, "stock")
    first_b = res.requests["t/b"].chunks[0][0]
    assert parts["unique"] == 240 + 40 and parts["grid"] == 200 - 192
    assert parts["same_round"] == 0 and parts["later_short"] == 192 - first_b
    assert waste.check(parts)
