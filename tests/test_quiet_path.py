"""The traversal's fixed per-round host cost (issue 11): work skipped where it cannot change
anything, with decisions, rounds and exactness unchanged.

- The quiet path: a visit while no producer is indexed (none in flight, none admitted yet this
  scan) cannot be Blocked, so it goes native without the producer lookup (`Traversal.quiet`,
  `RadixFlowRuntime.park`). Taken exactly then: the tests fail if it is removed (no quiet
  visit counted) or taken wrongly (a request a live producer blocks is no longer parked).
- `group_wait_wins` copies its records without `dataclasses.replace` (core/cost.py `_copy`):
  identical verdicts and sums, bit for bit.
- A boundary key hashes the prefix's int64 bytes (adapter/boundary_scan.py `prefix_key`): one
  key per token sequence whatever its container.
"""

from __future__ import annotations

import random
from array import array
from dataclasses import replace

import pytest

from radixflow_sglang.core import cost as cost_mod
from radixflow_sglang.core.cost import CostCoeffs, RoundView, WaitCase, group_wait_wins
from radixflow_sglang.core.traversal import Traversal

DOC = list(range(10_000, 12_000))


def _unique(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


# --- the quiet path ---------------------------------------------------------------------------


def test_the_first_visit_of_an_idle_scan_is_quiet_the_rest_are_not(make_kit) -> None:
    """Nothing in flight, nothing admitted: the first visit takes the quiet path; once it is
    admitted (a producer), later visits of the scan look it up, sharing or not."""
    k = make_kit("qwen3.5-4b", "extra_buffer", "traversal-always", overlap=True)
    k.submit(k.req("A", DOC + [1] * 40), k.req("B", _unique(50_000, 300)),
             k.req("C", DOC + [2] * 40))
    k.step()
    rt = k.runtime
    assert rt.quiet_visits == 1
    assert rt.stats.visited == 3
    # C shares A's document: A (admitted this scan) is moved to publish at the fork, C parks
    assert set(k.rounds[-1].rids) == {"A", "B"} and k.runtime.records.parked() == ["C"]


@pytest.mark.parametrize("overlap", [True, False])
def test_a_request_a_live_producer_blocks_never_takes_the_quiet_path(make_kit, overlap) -> None:
    """P in flight (overlap) or admitted earlier in the same scan: A, sharing P's document,
    is Blocked and parks; the quiet path would have sent it native."""
    k = make_kit("qwen3.5-4b", "extra_buffer", "traversal-always", overlap=overlap)
    if overlap:
        k.submit(k.req("P", DOC + [1] * 40))
        k.step()  # P in flight: a producer for the next scan
        k.submit(k.req("A", DOC + [2] * 40))
    else:
        k.submit(k.req("P", DOC + [1] * 40), k.req("A", DOC + [2] * 40))
    before = k.runtime.quiet_visits
    k.step()
    assert "A" in k.runtime.records.parked() and "A" not in k.rounds[-1].rids
    assert k.runtime.quiet_visits == before + (0 if overlap else 1)  # P's visit alone


def test_an_empty_index_is_quiet_and_a_producer_is_not() -> None:
    from radixflow_sglang.core.grid import Grid, Layout
    from radixflow_sglang.core.producers import Producer
    from radixflow_sglang.core.traversal import TraversalConfig

    t = Traversal(TraversalConfig.default(Grid(Layout.EXTRA_BUFFER, 64), overlap=True))
    t.begin_round([], 1 << 30)
    assert t.quiet()
    t.admitted(Producer("P", None, DOC, 0, len(DOC), len(DOC), True))
    assert not t.quiet()
    t.begin_round([Producer("P", None, DOC, 0, len(DOC), len(DOC), True)], 0)
    assert not t.quiet()  # in flight
    t.begin_round([], 0)
    assert t.quiet()


@pytest.mark.parametrize(("layout", "overlap"), [("extra_buffer", True), ("no_buffer", False)])
def test_the_quiet_path_changes_no_round(monkeypatch, layout, overlap) -> None:
    """The twin's probe workload (sharing, parking, holds, a fragment) replays the same rounds,
    rows, tokens and hits with the quiet path disabled; and it was taken."""
    from eval import twin

    segs = twin.probe_segments()[:2]
    taken = {"n": 0}
    real = Traversal.quiet

    def counting(self) -> bool:
        q = real(self)
        taken["n"] += q
        return q

    monkeypatch.setattr(Traversal, "quiet", counting)
    fast = twin.replay(segs, "qwen3.5-4b", "radixflow", layout=layout, overlap=overlap)
    assert taken["n"] > 0
    monkeypatch.setattr(Traversal, "quiet", lambda self: False)
    slow = twin.replay(segs, "qwen3.5-4b", "radixflow", layout=layout, overlap=overlap)
    assert fast.ok and slow.ok
    key = [(r.rows, r.tokens, r.hit_tokens, r.start_s) for r in fast.rounds]
    assert key == [(r.rows, r.tokens, r.hit_tokens, r.start_s) for r in slow.rounds]
    assert fast.latencies == slow.latencies


# --- group_wait_wins without dataclasses.replace ----------------------------------------------


def _sample(rng: random.Random) -> tuple[CostCoeffs, WaitCase, RoundView]:
    c = CostCoeffs(rng.choice([0.0, 8e-3, 5e-2]), rng.choice([2.8e-6, 1.7e-5, 1e-4]),
                   rng.choice([0.0, 1e-4, 1e-3]), rng.choice([0.0, 1e-9]))
    length = rng.randrange(66, 9000)
    depth = rng.randrange(64, length)
    case = WaitCase(rng.randrange(0, depth - 63), depth, length, rng.choice([1, 2]),
                    rng.choice([0, rng.randrange(1, 2000)]))
    budget = rng.choice([512, 2048, 8192])
    v = RoundView(rows=rng.randrange(0, 20), behind=rng.randrange(1, 80),
                  budget_left=rng.randrange(0, budget + 1), demand_after=rng.randrange(0, 30_000),
                  mean_extend=rng.uniform(30, 3000), rows_left=rng.randrange(0, 64),
                  parked_tokens=rng.randrange(0, 4000), parked_rows=rng.randrange(0, 5),
                  token_budget=budget, row_budget=64, siblings=rng.choice([0, 1, 2, 3, 7, 30]),
                  host_s=rng.choice([0.0, 2e-3]), arrival_rate=rng.choice([0.0, 5.0]))
    return c, case, v


def test_group_wait_wins_gives_what_replace_gave(monkeypatch) -> None:
    rng = random.Random(5)
    samples = [_sample(rng) for _ in range(2000)]
    now = [group_wait_wins(*s) for s in samples]
    monkeypatch.setattr(cost_mod, "_copy", replace)  # the loop as it was
    before = [group_wait_wins(*s) for s in samples]
    assert now == before  # exact floats, not approx
    assert {v.wait for v in now} == {True, False}


def test_copy_is_replace() -> None:
    rng = random.Random(6)
    for _ in range(200):
        _, case, v = _sample(rng)
        ch = {"demand_after": rng.randrange(0, 100), "rows": rng.randrange(0, 9), "siblings": 0}
        got = cost_mod._copy(v, **ch)
        assert type(got) is RoundView and got == replace(v, **ch)
        assert cost_mod._copy(case, cut_rest=0) == replace(case, cut_rest=0)
    with pytest.raises(AttributeError):
        got.rows = 1  # still frozen


# --- boundary keys --------------------------------------------------------------------------


def test_a_boundary_key_is_the_same_for_a_list_and_an_array() -> None:
    from radixflow_sglang.adapter.boundary_scan import prefix_key as _key

    toks = _unique(3, 2000)
    arr = array("q", toks)
    assert _key("ns", toks, 1500) == _key("ns", arr, 1500) == _key("ns", toks + [9], 1500)
    assert _key("ns", toks, 1500) != _key("ns", toks, 1436)
    other = list(toks)
    other[1499] += 1
    assert _key("ns", toks, 1500) != _key("ns", other, 1500)
    assert _key("ns", toks, 1500) != _key("other", toks, 1500)
