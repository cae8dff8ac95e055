"""Where rows bind, a request whose shared prefix is published goes before its own arrival pass
(ORDER `rechecked_first`, case `published_first`; issue 51, the gsp burst at the paper profile).

A burst reaches the scheduler in one pass, in an order that mixes its groups. Once a group's
producer has published the state at the group's fork, its siblings need only their tails; the
other groups' requests need their whole prompt. Where SGLang's row limit binds, every row
admitted holds its request for its whole decode: under FCFS the round fills the rows with the
groups queued first, producers that compute their prompt and whose siblings then wait a decode
cycle for rows, while the published siblings wait behind them (twin, gsp burst, extra_buffer,
paper profile: the first wave of 16 rows took 11 producers in 4 rounds). Visited first, the
published siblings fill the rows from the state, the wave ends sooner, and the producers start
the next wave. A request of an earlier pass is never passed. On SGLang's real cache, pools,
Req and scan (the kit).
"""

from __future__ import annotations

import random

import pytest

from radixflow_sglang.core.reasons import Reason as R
from radixflow_sglang.core.reasons import ablating

MODEL = "qwen3.5-4b"
ROWS, N, G = 4, 4, 64
SYSTEM = 5 * G + 10  # NOTE: the declared boundary: the groups' shared prompt


def _group(k, rng, name: str, n: int = N, start: int = 0, new: int = 16) -> list:
    """`n` requests of group `name` (its shared prompt, a distinct tail each), boundary declared."""
    prompt = _group.prompts.setdefault(name, [rng.randrange(100, 200_000) for _ in range(SYSTEM)])
    return [k.req(f"{name}/{i}", prompt + [rng.randrange(100, 200_000) for _ in range(G + 3)],
                  max_new_tokens=new, boundary=SYSTEM) for i in range(start, start + n)]


_group.prompts = {}


def _burst(make_kit, policy: str, layout: str, passes: int = 1, priority: bool = False):
    """a/0 runs beside ROWS - 1 short fillers (its state published at a's boundary; it decodes
    longest); then, while the rows are full, b's group and a's three siblings arrive, b's
    first in the queue: in one pass (`passes` 1), or b's a pass before a's siblings (2). When
    the fillers end, the 3 rows free cannot take all 7: rows bind. Drained; the kit."""
    _group.prompts.clear()
    rng = random.Random(0)
    k = make_kit(MODEL, layout, policy, rows=ROWS)
    k.sched.enable_priority_scheduling = priority  # NOTE: priorities all equal: FCFS order
    k.submit(*_group(k, rng, "a", n=1, new=64),
             *[k.req(f"f/{i}", [rng.randrange(100, 200_000) for _ in range(G)], max_new_tokens=8)
               for i in range(ROWS - 1)])
    while len(k.sched.running_batch.reqs) < ROWS:
        k.step()
    k.submit(*_group(k, rng, "b"))
    if passes == 2:
        k.step()  # NOTE: a decode step; the pass sees (registers) b's requests
    k.submit(*_group(k, rng, "a", n=N - 1, start=1))
    k.drain()
    return k


@pytest.mark.parametrize("layout", ["extra_buffer", "no_buffer"])
def test_published_siblings_take_the_rows_before_their_pass(make_kit, layout):
    k = _burst(make_kit, "radixflow", layout)
    first = k.first_rounds()
    sibs = [first[f"a/{i}"] for i in range(1, N)]
    # NOTE: a's siblings run together from a/0's state, before b's producer takes a row
    assert len(set(sibs)) == 1 and sibs[0] < first["b/0"]
    assert all(k.rounds[sibs[0]].prefix[f"a/{i}"] >= SYSTEM // G * G for i in range(1, N))
    assert not k.sched.waiting_queue and k.leaks() == {"kv": 0, "rows": 0, "mamba": 0}
    assert k.runtime.summary()["order_reasons"].get(R.PUBLISHED_FIRST.value, 0) == N - 1


@pytest.mark.parametrize("layout", ["extra_buffer", "no_buffer"])
def test_without_the_case_the_queue_order_fills_the_rows(make_kit, layout):
    """The rule ablated (FCFS): b's producer, queued first, takes a row before a's siblings."""
    with ablating([R.RECHECKED_FIRST]):
        first = _burst(make_kit, "radixflow", layout).first_rounds()
    assert first["b/0"] < max(first[f"a/{i}"] for i in range(1, N))


def test_an_earlier_pass_is_not_passed(make_kit):
    """b's group arrived a pass before a's siblings: it keeps its place (FCFS across passes)."""
    k = _burst(make_kit, "radixflow", "extra_buffer", passes=2)
    first = k.first_rounds()
    assert first["b/0"] <= min(first[f"a/{i}"] for i in range(1, N))
    assert R.PUBLISHED_FIRST.value not in k.runtime.summary()["order_reasons"]


@pytest.mark.parametrize("priority", [False, True])
def test_priority_scheduling_walks_no_tree(make_kit, monkeypatch, priority):
    """Priority scheduling keeps SGLang's order: the case does not walk the tree for states
    it could only discard (`state_covers`), nor report an order it did not make."""
    import radixflow_sglang.adapter.runtime as rt

    walks = []
    covers = rt.state_covers
    monkeypatch.setattr(rt, "state_covers", lambda *a: walks.append(a[1].rid) or covers(*a))
    k = _burst(make_kit, "radixflow", "extra_buffer", priority=priority)
    reasons = k.runtime.summary()["order_reasons"]
    assert bool(walks) is not priority, walks
    assert (R.PUBLISHED_FIRST.value in reasons) is not priority, reasons
    assert R.PRIORITY_ORDER.value not in reasons  # NOTE: nothing waited: no order to keep
