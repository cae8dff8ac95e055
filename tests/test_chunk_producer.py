"""A chunked producer's last chunk is a producer too (issue 12, item 3: the overload token loss).

Under load a long shared prefix often starts in a round's residual budget: its first chunk is
cut short and the rest runs as SGLang's continuing chunked request next round. That last chunk
is the one that reaches the fork, but `PrefillAdder.add_chunked_req` returns None for it
(the prefill is done), so the scan's `chunk_continued` hook saw nothing and siblings visited in
that round were admitted natively from the first chunk's state, recomputing the rest. On the
twin (Qwen3.5-4B mix, cold, 300 questions, 20 q/s) that was ~350k of radixflow's tokens.
Expected depths come from the first chunk's length and the model's grid, never typed in.
"""

from __future__ import annotations

import math

import pytest

from radixflow_sglang.testing.fixtures import NO_LEAK, coverage_errors, toks

DOC = toks(1000, 2000)  # the shared prefix
BUDGET = 2048  # tokens per round: a 1,500-token filler leaves the producer a short first chunk
CASES = [
    pytest.param("qwen3.5-4b", "extra_buffer", id="qwen3.5-4b-extra_buffer"),
    pytest.param("nemotron-9b", "extra_buffer", id="nemotron-9b-extra_buffer"),
    pytest.param("qwen3-8b", "extra_buffer", id="qwen3-8b-full"),
]


def _rounds(make_kit, model: str, layout: str, policy: str, overlap: bool = False):
    k = make_kit(model, layout, policy, tokens=BUDGET, overlap=overlap)
    reqs = {"X": toks(50_000, 1500), "P": DOC + toks(5000, 100), "A": DOC + toks(6000, 120),
            "B": DOC + toks(7000, 90)}
    k.submit(*[k.req(rid, ids) for rid, ids in reqs.items()])
    rounds = k.drain()
    assert coverage_errors(rounds, {rid: len(ids) for rid, ids in reqs.items()}) == []
    assert k.leaks() == NO_LEAK
    return k, rounds


def _first(rounds, rid: str):
    return next(r for r in rounds if rid in r.rids)


@pytest.mark.parametrize("model, layout", CASES)
@pytest.mark.parametrize("overlap", [False, True], ids=["normal", "overlap"])
def test_siblings_wait_for_the_last_chunk_of_a_chunked_producer(make_kit, model, layout,
                                                                overlap):
    k, rounds = _rounds(make_kit, model, layout, "traversal-always", overlap)
    r1 = rounds[0]
    assert r1.rids == ["X", "P"] and r1.chunked == "P"  # P starts in the residual budget
    first = r1.extend["P"]
    assert 0 < first < len(DOC) - 64
    r2 = _first(rounds[1:], "P")
    assert r2.prefix["P"] == first and r2.chunked is None  # its last chunk: not truncated
    if k.runtime.grid.layout.value == "full":
        fork = len(DOC) // k.runtime.grid.size * k.runtime.grid.size  # every page published
    else:
        g = math.lcm(k.geometry.grid, k.cfg.page_size)
        fork = first + (len(DOC) - first) // g * g  # on the grid from the chunk's own prefix
        assert r2.track["P"] == fork  # the last chunk publishes at the fork
    for rid in ("A", "B"):
        assert _first(rounds, rid).index > r2.index  # parked while the last chunk runs
        assert _first(rounds, rid).prefix[rid] == fork  # then reuses the whole shared prefix
    assert k.runtime.totals.blocked >= 2


@pytest.mark.parametrize("model, layout", CASES)
def test_stock_recomputes_from_the_first_chunk_state(make_kit, model, layout):
    """The loss the fix removes, on SGLang's own scheduler: the first sibling starts from the
    first chunk's state and recomputes the rest of the shared prefix."""
    _, rounds = _rounds(make_kit, model, layout, "stock")
    first = rounds[0].extend["P"]
    assert _first(rounds, "A").prefix["A"] <= first
