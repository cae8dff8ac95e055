"""PLACE `queued_fork` (adapter/placement.py `PlacementTargets.queued`) on SGLang's real cache,
pools, Req and scan (the kit): nothing declared, a burst whose token budget fills with each
group's first request before its siblings are visited. The first publishes at the fork its
queued siblings share (extra_buffer: moves its one tracked state; no_buffer: cuts there); they
resume there instead of recomputing the prefix."""

from __future__ import annotations

import random
from contextlib import nullcontext

import pytest

from radixflow_sglang.config import RadixFlowConfig
from radixflow_sglang.core.reasons import Reason, ablating
from radixflow_sglang.testing.fixtures import model_grid
from radixflow_sglang.testing.kit import Kit, KitConfig

MODEL = "qwen3.5-4b"


def burst(ablate: bool = False, groups: int = 4, per_group: int = 3, overlap: bool = False,
          layout: str = "extra_buffer"):
    """(kit, rounds, first ready prefix per rid, system length) of an interleaved burst: every
    group's first request, then every group's second, ...; a budget of two requests."""
    G = model_grid(MODEL)
    system, question = 3 * G + 10, G + 3
    rng = random.Random(5)

    def rand(n: int) -> list[int]:
        return [rng.randrange(100, 200_000) for _ in range(n)]

    kit = Kit(KitConfig(model=MODEL, layout=layout, tokens=2 * (system + question),
                        overlap=overlap),
              policy="radixflow", radixflow_config=RadixFlowConfig(policy="radixflow",
                                                                   boundaries="learned"))
    prompts = [rand(system) for _ in range(groups)]
    reqs = [kit.req(f"g{g}r{i}", prompts[g] + rand(question))
            for i in range(per_group) for g in range(groups)]
    with ablating([Reason.QUEUED_FORK]) if ablate else nullcontext():
        kit.submit(*reqs)
        rounds = kit.drain()
    first = {rid: next(r.prefix[rid] for r in rounds if rid in r.prefix)
             for rid in (q.rid for q in reqs)}
    return kit, rounds, first, system


@pytest.mark.parametrize("overlap", [False, True])
def test_the_first_of_a_group_publishes_where_its_unvisited_siblings_fork(overlap):
    G = model_grid(MODEL)
    kit, rounds, first, system = burst(overlap=overlap)
    fork = system // G * G
    assert all(first[f"g{g}r0"] == 0 for g in range(4))
    assert all(first[f"g{g}r{i}"] >= fork for g in range(4) for i in (1, 2))
    assert kit.runtime.boundary.moved["queued_fork"] >= 4
    assert kit.runtime.report.boundary_reasons[Reason.QUEUED_FORK] >= 4
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


def test_without_the_rule_each_second_sibling_recomputes_the_prefix():
    """The control: ablated, a group's second request finds the first's end state off its path
    and recomputes the shared prompt (SGLang's native branch then serves the third)."""
    G = model_grid(MODEL)
    _, rounds, first, system = burst(ablate=True)
    _, rounds_on, first_on, _ = burst()
    assert [first[f"g{g}r1"] for g in range(4)] == [0] * 4
    assert all(first[f"g{g}r2"] >= system // G * G for g in range(4))
    scheduled = sum(sum(r.extend.values()) for r in rounds)
    scheduled_on = sum(sum(r.extend.values()) for r in rounds_on)
    assert scheduled - scheduled_on >= 4 * (system // G * G)


def test_requests_that_share_nothing_place_nothing():
    kit, _, first, _ = burst(groups=4, per_group=1)
    assert kit.runtime.boundary.moved["queued_fork"] == 0
    assert kit.runtime.report.boundary_reasons[Reason.QUEUED_FORK] == 0
    assert set(first.values()) == {0}


@pytest.mark.parametrize("continued, moved", [(0.0, 1), (1.0, 0)])
def test_a_shallow_fork_keeps_the_end_where_continuations_use_it(monkeypatch, continued, moved):
    """One state, two uses (`place`): a queued request shares a short prefix (1 G), a
    continuation of the end (4 G) would resume there. Where the namespace's reuse events
    are all continuations, the end serves more (4 G > 2 x 1 G): it stays."""
    G = model_grid(MODEL)
    rng = random.Random(8)

    def rand(n: int) -> list[int]:
        return [rng.randrange(100, 200_000) for _ in range(n)]

    kit = Kit(KitConfig(model=MODEL, layout="extra_buffer", tokens=4 * G + 20),
              policy="radixflow", radixflow_config=RadixFlowConfig(policy="radixflow",
                                                                   boundaries="learned"))
    monkeypatch.setattr(kit.runtime.boundary.targets, "continuations", lambda ns: continued)
    head = rand(G + 10)
    kit.submit(kit.req("a", head + rand(3 * G + 5)), kit.req("b", head + rand(3 * G + 5)))
    kit.drain()
    assert kit.runtime.boundary.moved["queued_fork"] == moved
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


def test_no_buffer_cuts_the_first_at_the_fork_its_unvisited_siblings_share():
    """no_buffer: the boundary is a cut (SGLang's one chunk slot; the rest runs next round),
    priced as any undeclared cut (`cut_pays`), deferred for the slot (`boundary_slot`)."""
    on, rounds_on, first_on, system = burst(layout="no_buffer")
    _, rounds_off, first_off, _ = burst(ablate=True, layout="no_buffer")
    followers = [f"g{g}r{i}" for g in range(4) for i in (1, 2)]
    assert on.runtime.boundary.moved["queued_fork"] >= 3
    assert sum(first_on[r] == 0 for r in followers) < sum(first_off[r] == 0 for r in followers)
    assert (sum(sum(r.extend.values()) for r in rounds_on)
            < sum(sum(r.extend.values()) for r in rounds_off))
    assert on.leaks() == {"kv": 0, "rows": 0, "mamba": 0}
