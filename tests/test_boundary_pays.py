"""Learned boundaries that pay (issue 36 item 5): a learned cut costs its request a round, so it
is made only when its expected users (the share of earlier learned placements a later request
used, `BoundaryPublisher.placed`) save more than that round; a learned cut otherwise
publishes as SGLang does (`cut_unpaid`). On SGLang's classes (the kit), no_buffer."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from radixflow_sglang.core.boundary import UsageRate
from radixflow_sglang.core.cost import CostCoeffs
from radixflow_sglang.core.reasons import PUBLISH, RULES, Reason
from radixflow_sglang.testing.fixtures import boundary_kit, model_grid

MODEL = "qwen3.5-4b"
# NOTE: tokens dear, rounds cheap: only the pay test decides; "fit:" as the estimator's
# measured coefficients
DEAR_TOKENS = CostCoeffs(1e-3, 1e-3, 0.0, 0.0, "fit:test")


def test_exposed_rate_falls_with_the_age_of_unused_states():
    u = UsageRate(window=4)
    assert u.exposed_rate == u.rate == 1.0  # NOTE: no evidence: the prior
    u.published("a", 64)
    assert u.exposed_rate == 1.0  # NOTE: age 0: no exposure yet
    for k in "bcd":
        u.published(k, 64)
    assert u.rate == 1.0  # NOTE: none left the window: `rate` has no evidence
    assert u.exposed_rate == pytest.approx(1 / (1 + (3 + 2 + 1) / 4))
    u.hit("a")  # NOTE: a used state is no exposure
    assert u.exposed_rate == pytest.approx(2 / (2 + (2 + 1) / 4))
    for k in "efgh":
        u.published(k, 64)  # NOTE: b, c, d leave the window unused: counted whole
    assert (u.used, u.unused) == (1, 3)
    assert u.exposed_rate == pytest.approx(2 / (2 + 3 + (3 + 2 + 1) / 4))
    assert u.open_depths() == [64]


def _kit():
    """radix (native selection), learned boundaries, no_buffer, a measured-looking fit, and
    a placement window of 4 (the default 64 takes longer to learn the same)."""
    from radixflow_sglang.adapter.boundary import BoundaryPublisher

    kit = boundary_kit("radix", "learned", "no_buffer", MODEL)
    pub = BoundaryPublisher("learned", kit.runtime.grid, cost=lambda: DEAR_TOKENS)
    pub.placed[Reason.LEARNED] = UsageRate(window=4)
    kit.runtime.boundary = pub
    return kit, pub


def _run(kit, rid: str, ids) -> tuple[int, Reason | None, int]:
    """(ready prefix at its first round, its PUBLISH rule, its prefill rounds)."""
    before = Counter(kit.runtime.report.boundary_reasons)
    kit.submit(kit.req(rid, ids))
    rounds = kit.drain()
    cached = next(r.prefix[rid] for r in rounds if rid in r.prefix)
    fresh = Counter(kit.runtime.report.boundary_reasons) - before
    how = [r for r in fresh if RULES[r].point == PUBLISH]
    assert len(how) <= 1
    return cached, (how[0] if how else None), sum(rid in r.rids for r in rounds)


def _teach(kit, rng, system: int, tail: int) -> None:
    """Two groups of three siblings, one after another: forks at the system prompt's grid
    floor, learned (and the second group's first is placed there and used)."""
    for g in range(2):
        prompt = [rng.randrange(100, 200_000) for _ in range(system)]
        for i in range(3):
            _run(kit, f"g{g}r{i}", prompt + [rng.randrange(100, 200_000) for _ in range(tail)])


def test_a_learned_cut_stops_once_its_placements_go_unused():
    """Unrelated prompts after the depth was learned (a trace whose requests share no prefix):
    each is placed at the learned depth and nobody shares it; the first are cut on the prior,
    then the measured hit rate no longer pays the round and they run whole, as stock."""
    G = model_grid(MODEL)
    kit, pub = _kit()
    rng = random.Random(0)
    _teach(kit, rng, 6 * G + 10, 2 * G + 3)
    hows, rounds, unpaid = [], [], pub.unpaid
    for i in range(8):
        _, how, n = _run(kit, f"u{i}", [rng.randrange(100, 200_000) for _ in range(8 * G + 13)])
        hows.append(how)
        rounds.append(n)
    assert hows[0] is Reason.CUT and rounds[0] == 2
    assert hows[-3:] == [Reason.CUT_UNPAID] * 3 and rounds[-3:] == [1] * 3
    assert pub.placed[Reason.LEARNED].exposed_rate < 0.5
    assert pub.unpaid - unpaid == hows.count(Reason.CUT_UNPAID)
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


def test_a_learned_cut_goes_on_while_later_requests_use_its_state():
    """Each prompt is followed by one sharing it to the learned depth only (a second question
    on a document): every placement is used, each first is cut and its follower resumes there."""
    G = model_grid(MODEL)
    kit, pub = _kit()
    rng = random.Random(1)
    system = 6 * G + 10
    _teach(kit, rng, system, 2 * G + 3)
    for i in range(4):
        doc = [rng.randrange(100, 200_000) for _ in range(system)]
        _, how, n = _run(kit, f"p{i}", doc + [rng.randrange(100, 200_000)
                                             for _ in range(2 * G + 3)])
        assert (how, n) == (Reason.CUT, 2)
        cached, _, _ = _run(kit, f"q{i}", doc + [rng.randrange(100, 200_000) for _ in range(G)])
        assert cached == 6 * G
    assert pub.placed[Reason.LEARNED].exposed_rate == 1.0
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}
