"""n > 1 sampling (SGLang's `n`, warm mode) in the twin: where radixflow's decode steps differ.

Issue 12 measured nsample warm at 1.06x stock's decode steps. The copies are not split: under
both arms the n copies of a prompt run their prefill in one round and decode in one batch, and
the decode work (rows x steps) is identical. Decode steps differ only by how often two prompts'
decode phases overlap (a step then serves both): radixflow finishes each prompt sooner, so
consecutive prompts overlap less. With prompts far apart the step counts are equal.
"""

from __future__ import annotations

import pytest

from eval.costmodel import cost_with
from eval.traffic import segments
from eval.twin import run_arm

MODEL = "qwen3.5-4b"
SHAPE = {"nsample_mode": "warm", "prompts": 3, "n": 4, "prompt_len": 512, "output_len": 64}


def _arm(policy: str, rate: float):
    segs = segments("nsample", MODEL, seed=1, rate=rate, **SHAPE)
    res = run_arm(segs, MODEL, policy, cost=cost_with(MODEL))
    assert res.ok, res.error
    return res


@pytest.fixture(scope="module")
def apart():
    """Prompts about 100 s apart: no two prompts are ever in flight together."""
    return {p: _arm(p, 0.01) for p in ("stock", "radixflow")}


@pytest.mark.parametrize("policy", ["stock", "radixflow"])
def test_copies_prefill_in_one_round_and_decode_in_one_batch(apart, policy) -> None:
    res = apart[policy]
    n, prompts, out = SHAPE["n"], SHAPE["prompts"], SHAPE["output_len"]
    copies = [r for r in res.rounds if r.rows > 1]
    assert len(copies) == prompts and all(r.rows == n for r in copies)
    assert all(r.rows == n for r in res.decode_rounds)  # never a split group
    # NOTE: a copy's first token comes from its prefill; the rest are decode steps
    assert len(res.decode_rounds) == prompts * (out - 1)


def test_far_apart_prompts_decode_in_as_many_steps_under_both(apart) -> None:
    s, r = apart["stock"].metrics, apart["radixflow"].metrics
    assert r["decode_steps"] == s["decode_steps"]
    assert r["scheduled_tokens"] < 0.5 * s["scheduled_tokens"]  # the copies reuse the warm state
    assert r["latency_mean_s"] < s["latency_mean_s"]


def test_overlapping_prompts_differ_only_by_shared_steps() -> None:
    """Prompts in a burst: decode rows x steps are the same under both arms; every step one
    arm has more is a step in which the other decoded two prompts' copies together."""
    arms = {p: _arm(p, 50.0) for p in ("stock", "radixflow")}
    work = {p: sum(d.rows for d in a.decode_rounds) for p, a in arms.items()}
    n, prompts, out = SHAPE["n"], SHAPE["prompts"], SHAPE["output_len"]
    assert work["stock"] == work["radixflow"] == n * prompts * (out - 1)
    for a in arms.values():
        assert all(d.rows % n == 0 for d in a.decode_rounds)
        shared = sum(d.rows // n - 1 for d in a.decode_rounds)
        assert len(a.decode_rounds) == prompts * (out - 1) - shared
