"""hit_tokens counts real cache hits only (issue: harden item 2).

A chunked request's later chunks start from the chunks it computed itself: SGLang counts none
of that as cached (schedule_batch.py `prepare_for_extend`, prefix_len - already_computed), and
neither do the runtime's round counters (trace, /server_info, metrics) nor the step harness.
"""

from __future__ import annotations

import pytest

NO_LEAK = {"kv": 0, "rows": 0, "mamba": 0}


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


@pytest.mark.parametrize("policy", ["radix", "traversal"])
def test_a_continued_chunk_is_not_a_cache_hit(make_kit, policy):
    from radixflow_sglang.testing.harness import Harness

    k = make_kit("qwen3.5-4b", "extra_buffer", policy, tokens=512)
    h = Harness(k)
    k.keep_finished = True
    prompt = toks(1000, 1500)
    h.submit("A", prompt)
    h.drain(max_steps=100)
    chunks = [r for r in k.rounds if "A" in r.rids]
    assert len(chunks) == 3 and chunks[0].prefix["A"] == 0  # cut by the 512-token budget
    assert chunks[1].prefix["A"] > 0  # its own first chunk
    assert k.runtime.totals.hit_tokens == 0 and h.hit_tokens == 0
    assert k.finished["A"].cached_tokens == 0  # SGLang's own count agrees
    # a later request with the same prompt hits what A's chunks cached: a real hit
    h.submit("B", prompt)
    h.drain(max_steps=100)
    hit = k.finished["B"].cached_tokens
    assert hit > 0 and [r.prefix["B"] for r in k.rounds if "B" in r.rids] == [hit]
    assert k.runtime.totals.hit_tokens == hit == h.hit_tokens
    assert k.runtime.summary()["hit_tokens"] == hit
    assert not h.violations, h.violations.examples
    assert h.finish() == NO_LEAK


def test_the_twins_rounds_count_real_hits_only():
    """The twin's per-round hit_tokens add up to its per-request hits (prefix at first
    selection) when a request is chunked: its later chunks count nothing."""
    from eval import twin
    from eval.costmodel import CostModel
    from eval.workload import Branch, Question, Segment

    prompt = toks(1000, 1500)
    qs = [Question(q, q, (Branch(f"{q}/A", prompt, "ns", 0),), 0, 0, arrival_s=t)
          for q, t in (("first", 0.0), ("again", 10.0))]
    res = twin.replay([Segment("cold", "forward", tuple(qs))], "qwen3.5-4b", "radix",
                      cost=CostModel(0.01, 1e-5, 1e-3), kit_overrides={"tokens": 512})
    assert len(res.rounds) == 4  # three chunks of the first request, one round for the second
    m = res.metrics
    assert 0 < m["hit_tokens"] == sum(r.hit_tokens for r in res.rounds)
    assert [r.hit_tokens for r in res.rounds[:3]] == [0, 0, 0]
