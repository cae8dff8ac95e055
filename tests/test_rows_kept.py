"""A parked consumer keeps its row from a later arrival (issue 51, the nsample loss at the paper
profile).

Where SGLang's row limit binds, a round that parks a prompt's copies behind their producer
(copy 0) must not hand the rows those copies would have taken to a later prompt's producer:
the copies would then wait a whole decode cycle for rows, and the n-request (done when its
last copy ends) finishes a cycle later than under stock (twin, paper profile: 1.078x stock's
mean). The row limit counts the rows of this scan's parks that arrived in an earlier pass
(adapter/scanstate.py `Scan.rows_kept`), so rows go first come, first served as under stock,
and the copies run the round after their producer, from its state; a burst's requests (one
pass) have no order to keep. On SGLang's real cache, pools, Req and scan (the kit).
"""

from __future__ import annotations

import random

import pytest

MODEL = "qwen3.5-4b"
ROWS, N, LENGTH = 4, 4, 512


def _arrivals(make_kit, policy: str, layout: str, together: bool = False):
    """ROWS fillers decode while two prompts of N copies each arrive, prompt b a pass after
    prompt a (`together`: in a's pass, one burst); drained; the kit."""
    k = make_kit(MODEL, layout, policy, rows=ROWS)
    rng = random.Random(0)
    k.submit(*[k.req(f"f/{i}", [rng.randrange(100, 200_000) for _ in range(64)],
                     max_new_tokens=8) for i in range(ROWS)])
    k.step()  # NOTE: the fillers take every row
    for p in "ab":
        ids = [rng.randrange(100, 200_000) for _ in range(LENGTH)]
        k.submit(*[k.req(f"{p}/{i}", ids, max_new_tokens=16) for i in range(N)])
        if not together:
            k.step()  # NOTE: a decode step; the pass sees (registers) this prompt's copies
    k.drain()
    return k


@pytest.mark.parametrize("layout", ["extra_buffer", "no_buffer"])
def test_a_parked_copy_keeps_its_row_from_a_later_prompts_producer(make_kit, layout):
    k = _arrivals(make_kit, "radixflow", layout)
    first = k.first_rounds()
    a = [first[f"a/{i}"] for i in range(N)]
    # NOTE: the copies parked behind a/0 (they reuse its state: the park happened)
    assert min(a[1:]) > a[0]
    assert all(k.rounds[a[i]].prefix[f"a/{i}"] > 0 for i in range(1, N))
    # NOTE: b's producer, a pass later, does not take a row an a copy parked ahead of it
    # would have taken: every a copy runs before any b request, the round after its producer
    # (not a decode cycle later, behind b/0)
    assert max(a) < first["b/0"]
    assert set(a[1:]) == {a[0] + 1}
    assert not k.sched.waiting_queue and k.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


def test_a_burst_keeps_no_row_among_its_own(make_kit):
    """Arrived in one pass, the requests have no order to keep: b's producer takes a free row
    behind a's parked copies, as without the rule."""
    first = _arrivals(make_kit, "radixflow", "extra_buffer", together=True).first_rounds()
    assert first["b/0"] == first["a/0"]


def test_stock_takes_the_rows_in_queue_order(make_kit):
    """The order the parked copies keep: stock's (its first prompt's copies fill the rows)."""
    first = _arrivals(make_kit, "stock", "extra_buffer").first_rounds()
    assert {first[f"a/{i}"] for i in range(N)} == {first["a/0"]}
    assert first["b/0"] > first["a/0"]
