"""Decode in the kit: SGLang 0.5.23's real event loop (`get_next_batch_to_run`, the running
batch, `update_running_batch`, retraction) and its real result processor, on CPU.

Depths are derived from the model's grid and SGLang's own track interval, never typed in.
"""

from __future__ import annotations

from collections import deque

import pytest

from radixflow_sglang.testing.fixtures import old_step

NO_LEAK = {"kv": 0, "rows": 0, "mamba": 0}


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def run(k, max_steps: int = 5000) -> list:
    """Step until idle; every launched round (prefill and decode), in order."""
    out = []
    for _ in range(max_steps):
        if not k.busy:
            return out
        rnd = k.step()
        if rnd is not None:
            out.append(rnd)
    raise AssertionError(f"not idle after {max_steps} steps")


def track_grid(k) -> int:
    """SGLang's decode checkpoint interval (runtime_context.py `mamba_track_grid`)."""
    from sglang.srt.runtime_context import mamba_track_grid

    return mamba_track_grid(k.cfg.page_size)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("policy", ["stock", "radixflow"])
def test_eight_tokens_are_one_prefill_and_seven_decode_steps(make_kit, policy, overlap):
    k = make_kit("qwen3.5-4b", "extra_buffer", policy, overlap=overlap)
    out = toks(900, 8)
    k.submit(k.req("a", toks(100, 300), max_new_tokens=8, output=out))
    rounds = run(k)
    assert [r.mode for r in rounds] == ["prefill"] + ["decode"] * 7
    assert list(k.finished["a"].output_ids) == out
    # each step reads the KV of everything before it, its own new token included
    assert [r.cached["a"] for r in k.decode_rounds] == list(range(301, 308))
    assert k.finished["a"].finished_reason.to_json()["type"] == "length"
    assert k.leaks() == NO_LEAK


@pytest.mark.parametrize("overlap", [False, True])
def test_a_prefill_runs_before_the_running_batch_decodes(make_kit, overlap):
    """scheduler.py `get_next_batch_to_run`: a prefill batch when one forms, else decode."""
    k = make_kit("qwen3.5-4b", "extra_buffer", "stock", overlap=overlap)
    k.submit(k.req("a", toks(100, 300), max_new_tokens=12),
             k.req("b", toks(1000, 400), max_new_tokens=12))
    assert k.step().rids == ["a", "b"]
    d = k.step()
    assert d.mode == "decode" and d.rids == ["a", "b"]
    k.submit(k.req("c", toks(5000, 200), max_new_tokens=4))
    p = k.step()
    assert p.mode == "prefill" and p.rids == ["c"]  # the running batch waits a step
    d2 = k.step()
    assert d2.mode == "decode" and d2.rids == ["a", "b", "c"]
    assert d2.cached["a"] == d.cached["a"] + 1  # no decode step ran for a and b meanwhile
    run(k)
    assert {r: len(q.output_ids) for r, q in k.finished.items()} == {"a": 12, "b": 12, "c": 4}
    assert k.leaks() == NO_LEAK


@pytest.mark.parametrize("model, layout", [("qwen3-8b", "extra_buffer"),
                                           ("qwen3.5-4b", "extra_buffer"),
                                           ("qwen3.5-4b", "no_buffer")])
def test_a_follow_up_turn_hits_the_first_turn_and_its_output(make_kit, model, layout):
    k = make_kit(model, layout, "stock")
    prompt, answer = toks(2000, 500), toks(60_000, 40)
    k.submit(k.req("t1", prompt, max_new_tokens=len(answer), output=answer))
    run(k)
    assert list(k.finished["t1"].output_ids) == answer
    k.submit(k.req("t2", prompt + answer + toks(70_000, 30)))
    run(k)
    hit = k.rounds[-1].prefix["t2"]
    computed = len(prompt) + len(answer) - 1  # the last generated id was never fed back
    if not k.geometry.hybrid or layout == "no_buffer":
        # full attention caches every computed token; no_buffer the state at the sequence end
        assert hit == computed
    else:
        # extra_buffer: the last state decode tracked, on SGLang's track interval
        tg = track_grid(k)
        assert computed // tg * tg > len(prompt)  # the workload crosses one (else no test)
        assert hit == computed // tg * tg
    assert hit > len(prompt)  # the first turn's output is part of the hit
    assert k.leaks() == NO_LEAK


@pytest.mark.parametrize("overlap", [False, True])
def test_max_new_tokens_zero_finishes_at_its_prefill(make_kit, overlap):
    """SGLang's prefix-warm request (n > 1): prefill only, length 0, no decode step; its
    prompt stays cached for the siblings that follow."""
    k = make_kit("qwen3-8b", "extra_buffer", "stock", overlap=overlap)
    prompt = toks(3000, 400)
    k.submit(k.req("warm", prompt, max_new_tokens=0))
    rounds = run(k)
    assert [r.mode for r in rounds] == ["prefill"] and k.decode_rounds == []
    req = k.finished["warm"]
    assert req.finished_reason.to_json() == {"type": "length", "length": 0}
    assert req.finished_len == 0
    k.submit(*[k.req(f"s{i}", prompt, max_new_tokens=3) for i in range(4)])
    run(k)
    assert [k.rounds[-1].prefix[f"s{i}"] for i in range(4)] == [len(prompt) - 1] * 4
    assert k.leaks() == NO_LEAK


@pytest.mark.parametrize("model, layout, overlap", [("qwen3-8b", "extra_buffer", False),
                                                    ("qwen3.5-4b", "extra_buffer", True),
                                                    ("qwen3.5-4b", "no_buffer", False)])
def test_retraction_under_a_tiny_kv_pool(make_kit, model, layout, overlap):
    """retract_decode frees KV under pressure, the retracted request re-queues and re-prefills
    its input plus what it generated; each request completes once with its whole scripted
    output, the harness invariants hold and nothing leaks. (Without ignore_eos, admission
    reserves only new_token_ratio of a running request's remaining output: the short
    requests' exit lets two long ones in that do not fit together.)"""
    from radixflow_sglang.testing.harness import Harness

    k = make_kit(model, layout, "radixflow", overlap=overlap, kv_tokens=3000, rows=16)
    h = Harness(k)
    k.keep_finished = True
    outs = {}
    for i, n in enumerate([600] * 3 + [10] * 8 + [600] * 3):
        rid = f"r{i}"
        outs[rid] = toks(100_000 + 1000 * i, n)
        h.submit(rid, toks(1000 * (i + 1), 100), max_new_tokens=n, output=outs[rid],
                 ignore_eos=False)
    h.drain(max_steps=5_000)
    leaks = h.finish()
    assert not h.violations, h.violations.examples
    assert leaks == NO_LEAK
    assert k.retracted and h.decode_retractions == len(k.retracted)
    assert sorted(h.completions.count.values()) == [1] * 14
    assert {rid: list(r.output_ids) for rid, r in k.finished.items()} == outs
    rid = k.retracted[0]  # it re-prefilled its input and the ids it had generated
    assert max(r.prefix[rid] + r.extend[rid] for r in k.rounds if rid in r.extend) > 100


# --- the paper's one-token workload: the rounds the kit gave before decode -------------------


def one_token_workload(seed: int) -> list[tuple[int, list[tuple[str, list[int]]]]]:
    """Arrival step -> requests: shared documents, siblings, long chunked ones."""
    import random

    rng = random.Random(seed)
    docs = [toks(10_000 * (d + 1), rng.randrange(300, 2500)) for d in range(4)]
    out = []
    for i in range(24):
        doc = docs[rng.randrange(len(docs))]
        reqs = [(f"q{i}b{j}", doc + toks(500_000 + 1000 * i + 100 * j, rng.randrange(20, 90)))
                for j in range(rng.choice((1, 4)))]
        out.append((rng.randrange(0, 30), reqs))
    return sorted(out, key=lambda x: x[0])


def one_token_rounds(k, path: str) -> list[int]:
    """Run the workload through `path`; returns the rows in flight (launched, result not yet
    processed, unfinished; a chunk the round continues aside) at each launched round's scan."""
    arrivals = deque(one_token_workload(3))
    step, inflight = 0, []
    while arrivals or k.busy:
        while arrivals and arrivals[0][0] <= step:
            k.submit(*[k.req(rid, ids) for rid, ids in arrivals.popleft()[1]])
        q = k.sched.result_queue
        busy = [r.rid for r in q[0][0].reqs if not r.finished()] if q else []
        rnd = old_step(k) if path == "old" else k.step()
        if rnd is not None:
            inflight.append(len(set(busy) - set(rnd.rids)))
        step += 1
    assert k.leaks() == NO_LEAK and k.decode_rounds == []
    return inflight


@pytest.mark.parametrize("overlap, rows", [(False, 6), (True, 64)])
@pytest.mark.parametrize("policy", ["stock", "radixflow"])
def test_one_token_rounds_are_the_ones_before_decode(make_kit, policy, overlap, rows):
    shapes = {}
    for path in ("old", "new"):
        k = make_kit("qwen3.5-4b", "extra_buffer", policy, overlap=overlap, rows=rows,
                     tokens=2048)
        one_token_rounds(k, path)
        shapes[path] = [(r.rids, r.extend, r.prefix, r.track, r.chunked) for r in k.rounds]
    assert len(shapes["new"]) > 10
    if not overlap:
        assert max(len(s[0]) for s in shapes["new"]) == rows  # the row budget binds
    assert shapes["new"] == shapes["old"]


@pytest.mark.parametrize("policy", ["stock", "radixflow"])
def test_overlap_counts_in_flight_rows_against_the_row_budget(make_kit, policy):
    """Under overlap SGLang merges the in-flight prefill batch into the running batch before
    the next scan (`get_next_batch_to_run`), so its unfinished rows take row budget
    (`get_num_allocatable_reqs`: max_running_requests - running_bs). The kit before decode
    had no running batch: a round could take every row while the previous one was in flight."""
    rows = 6
    over = {}
    for path in ("old", "new"):
        k = make_kit("qwen3.5-4b", "extra_buffer", policy, overlap=True, rows=rows, tokens=2048)
        inflight = one_token_rounds(k, path)
        over[path] = [len(r.rids) + n for r, n in zip(k.rounds, inflight, strict=True)
                      if len(r.rids) + n > rows]
    assert over["new"] == [] and over["old"]
