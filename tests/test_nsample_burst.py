"""n samples sent as separate identical requests (RL rollouts, issue 12's nsample burst) on
SGLang's real cache, pools, Req and scan (the kit).

Live, the client sends the copies one by one and the first usually reaches the scheduler a
round before the rest (traced on the live nsample burst: `p1/0` alone in round 6, its 7 copies
registered 10 ms later). Alone, it publishes its state where SGLang puts it: at its end (no_buffer),
or at its last grid depth (extra_buffer), which for a grid-aligned prompt is its full length.
An identical copy matches at most length - 1 tokens (SGLang computes at least the last one),
so it finds nothing there; the depth learner then taught the grid floor of length - 1 from
those copies' forks, so in no_buffer every later copy recomputed a grid unit (64 tokens)
instead of one token. The learned repeat rule (`BoundaryLearner.repeat_wins`) publishes a
prompt of a namespace that repeats prompts at length - 1 (no_buffer: a cut, the one-token rest
publishes the end next round; extra_buffer: its grid floor, where SGLang's branch already is).
"""

from __future__ import annotations

import random

import pytest

MODEL = "qwen3.5-4b"


def make(policy: str, layout: str, boundaries: str = "both"):
    from radixflow_sglang.adapter.runtime import RadixFlowConfig
    from radixflow_sglang.testing.kit import Kit, KitConfig

    cfg = None if policy == "stock" else RadixFlowConfig(policy=policy, boundaries=boundaries)
    return Kit(KitConfig(model=MODEL, layout=layout), policy=policy, radixflow_config=cfg)


def grid() -> int:
    from radixflow_sglang.geometry import load_geometry

    return load_geometry(MODEL).grid


def burst(kit, prompts: int, n: int, length: int, seed: int = 0) -> list[list[int]]:
    """Per prompt, the ready prefix each copy first ran from; the first copy gets one scan of
    its own (it arrives alone), the other n - 1 arrive together after it."""
    rng = random.Random(seed)
    for p in range(prompts):
        ids = [rng.randrange(100, 200_000) for _ in range(length)]
        kit.submit(kit.req(f"p{p}/0", ids, max_new_tokens=4))
        kit.step()
        kit.submit(*[kit.req(f"p{p}/{k}", ids, max_new_tokens=4) for k in range(1, n)])
        kit.drain()
    first: dict[str, int] = {}
    for r in kit.rounds:
        for rid, ready in r.prefix.items():
            first.setdefault(rid, ready)
    return [[first[f"p{p}/{k}"] for k in range(n)] for p in range(prompts)]


def scheduled(kit) -> int:
    return sum(r.scheduled_tokens for r in kit.rounds)


def test_repeat_wins_needs_repeats_and_weighs_continuations():
    from radixflow_sglang.core.boundary import REPEAT, BoundaryLearner

    lr = BoundaryLearner(64)
    assert not lr.repeat_wins("ns", 0, 1024, 1023)  # NOTE: nothing seen yet
    lr.observe("ns", 1023, ("k", 0), None, repeat=True)
    assert not lr.repeat_wins("ns", 0, 1024, 1023)  # one repeat: below support
    assert lr.observe("ns", 1023, ("k", 1), None, repeat=True) == REPEAT
    assert lr.repeat_wins("ns", 0, 1024, 1023)
    assert not lr.repeat_wins("other", 0, 1024, 1023)  # per namespace
    assert not lr.repeat_wins("ns", 0, 1024, 1024)  # not a move
    # NOTE: a namespace of continuations (the next turns) keeps its end states
    for i in range(2):
        lr.published(("end", i), "end", 2000)
        lr.observe("ns", 2000, ("end", i), None)
    assert lr.repeat_wins("ns", 0, 1024, 1023)  # 2 x 1023 > 2 x 1
    assert not lr.repeat_wins("ns", 1000, 1024, 1010)  # 2 x 10 < 2 x 14
    lr.published(("k", 9), "repeat", 960)
    assert lr.publishes_at(960) and lr.kind(("k", 9)) == "repeat"


@pytest.mark.parametrize("layout", ["no_buffer", "extra_buffer"])
def test_copies_after_a_lone_first_copy_resume_at_length_minus_one(layout):
    G = grid()
    length, n, prompts = 16 * G, 4, 3
    kit = make("radixflow", layout)
    got = burst(kit, prompts, n, length)
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}
    # NOTE: the first prompt teaches it (its first copy published at its end: the second
    # copy recomputes, and is cut at length - 1 for the rest by the traversal)
    want = length - 1 if layout == "no_buffer" else (length - 1) // G * G
    assert got[0][2:] == [want] * (n - 2)
    for p in range(1, prompts):
        assert got[p] == [0] + [want] * (n - 1), (p, got[p])
    if layout == "no_buffer":
        assert kit.runtime.boundary.moved["repeat"] == prompts - 1
        stock = make("stock", layout)
        burst(stock, prompts, n, length)
        # NOTE: each later prompt computes itself once and one token per copy
        assert scheduled(kit) == (2 * length + n - 2) + (prompts - 1) * (length + n - 1)
        assert scheduled(stock) == prompts * n * length


def test_distinct_prompts_of_one_length_move_nothing():
    """noshare-like traffic (every prompt of one length, none repeated): no repeat is seen and
    nothing moves; every prompt's scheduled tokens equal stock's."""
    G = grid()
    kits = {p: make(p, "no_buffer") for p in ("stock", "radixflow")}
    for kit in kits.values():
        rng = random.Random(5)
        for i in range(6):
            kit.submit(kit.req(f"q{i}", [rng.randrange(100, 200_000) for _ in range(4 * G)],
                               max_new_tokens=2))
            kit.drain()
    assert kits["radixflow"].runtime.boundary.moved["repeat"] == 0
    assert scheduled(kits["radixflow"]) == scheduled(kits["stock"])


def test_repeat_share_is_the_share_of_admitted_requests_that_repeated():
    from radixflow_sglang.core.boundary import BoundaryLearner

    lr = BoundaryLearner(64, window=4)
    assert lr.repeat_share("ns") == 1.0  # NOTE: no admission seen: the prior
    lr.observe("ns", 0, None, None)
    lr.observe("ns", 1023, ("k", 0), None, repeat=True)
    assert lr.repeat_share("ns") == 0.5
    for _ in range(3):
        lr.observe("ns", 0, None, None)  # NOTE: distinct prompts (no reuse event at all)
    assert lr.repeat_share("ns") == 0.25  # NOTE: the last 4 admissions
    assert lr.repeat_share("other") == 1.0


def _retries_then_distinct(share: bool) -> list[int]:
    """no_buffer, a measured-looking cost: one prompt and two retries of it (the namespace
    repeats, so every later prompt is placed at length - 1), then groups of ten distinct
    prompts (a queue behind each: the cut's saving is multiplied by it). The repeat cuts made
    per group; `share` False: the placements' measured rate alone (the bound patched out)."""
    from radixflow_sglang.adapter.boundary import BoundaryPublisher
    from radixflow_sglang.core.boundary import BoundaryLearner
    from radixflow_sglang.core.cost import CostCoeffs
    from radixflow_sglang.core.reasons import Reason
    from radixflow_sglang.testing.fixtures import boundary_kit

    G = grid()
    kit = boundary_kit("radixflow", "both", "no_buffer", MODEL)
    cost = CostCoeffs(0.01, 1e-4, 0.0, 0.0, "fit:test")
    kit.runtime.boundary = BoundaryPublisher("both", kit.runtime.grid, cost=lambda: cost)
    if not share:
        kit.runtime.boundary.learner.repeat_share = lambda ns: 1.0
    rng = random.Random(3)

    def prompt() -> list[int]:
        return [rng.randrange(100, 200_000) for _ in range(16 * G)]

    first = prompt()
    for rid in ("p", "p/r0", "p/r1"):
        kit.submit(kit.req(rid, first, max_new_tokens=2))
        kit.drain()
    cuts = []
    for g in range(4):
        before = kit.runtime.boundary.moved["repeat"]
        kit.submit(*[kit.req(f"q{g}/{j}", prompt(), max_new_tokens=2) for j in range(10)])
        kit.drain()
        cuts.append(kit.runtime.boundary.moved["repeat"] - before)
    lr = kit.runtime.boundary.learner
    assert isinstance(lr, BoundaryLearner) and kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}
    if share:
        (ns,) = lr._admits
        assert lr.repeat_share(ns) == pytest.approx(2 / 43)  # NOTE: 2 retries of 43 admitted
        assert kit.runtime.report.boundary_reasons[Reason.CUT_UNPAID] > 0
    return cuts


def test_retries_among_distinct_prompts_stop_the_repeat_cuts_sooner():
    """A retry now and then is not n samples: each cut costs its request a round and the
    share of prompts that get repeated (2 of 43 here) bounds the cut's expected users from
    the first placement on, where the placements' measured rate starts at its prior (1) and
    falls only as they go unused (the Mooncake conversation trace, no_buffer: every prompt
    cut at length - 1 for a while, 1.005x stock's mean latency; bounded, 0.995x)."""
    bounded, rate_only = _retries_then_distinct(True), _retries_then_distinct(False)
    assert sum(bounded) < sum(rate_only)
    assert all(b <= r for b, r in zip(bounded, rate_only, strict=True))
    assert bounded[1] < rate_only[1]  # NOTE: the second group: the share is below 0.1
