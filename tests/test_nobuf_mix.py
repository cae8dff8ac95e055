"""no_buffer mix: a scheduler that saves prefill must not schedule more than stock (issue 11).

The matrix's no_buffer mix cells scheduled 1.10-1.22x stock's tokens. Two mechanisms, both
found in the twin's rounds (a second question on a document recomputed it whole, beside a
sibling recomputing it too) and pinned here on SGLang's real scan, pools and cache (the kit):

1. SGLang's one chunk slot is free in a scan whose continued chunked request runs its last
   chunk (`add_chunked_req` returns None, stock cuts a new chunk in that round), but the
   runtime decided the fork slots at `begin_scan`, before the continuation, and saw it taken:
   no producer could be cut at its fork, so its siblings were not Blocked and recomputed.
2. `ProducerIndex.sharers` confirms at most VERIFY sharers of the deepest shared block. Five
   or more producers of one block (a question's branches, then a second question on the same
   document, whose fork lies in the same block) hid the newest, the candidate's own producer.
3. With the slot free, the continued chunk's last chunk is a movable producer too: a sibling
   arriving during it waits for its fork instead of chaining on native chunk ends.

Depths are derived from the shapes (no_buffer cuts at the exact common prefix, page 1).
"""

from __future__ import annotations

import pytest

from radixflow_sglang.core.producers import Producer, ProducerIndex, common_prefix

DOC = list(range(1000, 3000))  # 2,000 shared tokens
MODELS = ["qwen3.5-4b", "nemotron-9b"]
NO_LEAK = {"kv": 0, "rows": 0, "mamba": 0}


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def first_prefix(rounds) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in rounds:
        for rid in r.rids:
            out.setdefault(rid, r.prefix[rid])
    return out


def tokens(rounds) -> int:
    return sum(r.scheduled_tokens for r in rounds)


def after_a_chunk(k, budget: int) -> dict[str, int]:
    """Round 1: a long unrelated request L is cut by the budget (SGLang's chunked request).
    Round 2: its last chunk runs while a question's two branches Q1, Q2 arrive."""
    lengths = {"L": budget + 300, "Q1": len(DOC) + 100, "Q2": len(DOC) + 120}
    k.submit(k.req("L", toks(50_000, lengths["L"])))
    r1 = k.step()
    assert r1.chunked == "L"  # the case arises: L continues in round 2
    k.submit(k.req("Q1", DOC + toks(5000, 100)), k.req("Q2", DOC + toks(6000, 120)))
    return lengths


@pytest.mark.parametrize("model", MODELS)
def test_the_fork_slot_is_free_when_the_continued_chunk_ends(make_kit, model):
    budget = 4096
    ks = make_kit(model, "no_buffer", "stock", tokens=budget)
    lengths = after_a_chunk(ks, budget)
    ks.drain()
    stock = ks.rounds
    k = make_kit(model, "no_buffer", "traversal-always", tokens=budget)
    after_a_chunk(k, budget)
    r2 = k.step()
    # L's last chunk ends: the slot is free, so Q1 is cut at the fork and Q2 waits for it
    assert r2.rids == ["L", "Q1"] and r2.chunked == "Q1" and r2.extend["Q1"] == len(DOC)
    assert k.runtime.traversal.waits.rids() == ["Q2"]
    k.drain()
    trav = k.rounds
    assert first_prefix(trav)["Q2"] == len(DOC)
    assert tokens(trav) == sum(lengths.values()) - len(DOC)
    assert first_prefix(stock)["Q2"] < len(DOC)  # stock recomputes the document in Q2
    assert tokens(trav) < tokens(stock)
    assert k.leaks() == NO_LEAK and ks.leaks() == NO_LEAK


def two_questions(k, branches: int, q1: list[int], q2: list[int]) -> dict[str, int]:
    """Question 1's branches (the first is cut at their fork, the rest wait); as its rest runs,
    question 2 on the same document arrives with two branches."""
    lengths = {}

    def sub(name: str, stem: list[int], n: int, base: int) -> None:
        for b in range(n):
            ids = DOC + stem + toks(base + 100 * b, 20 + b)
            lengths[f"{name}{b}"] = len(ids)
            k.submit(k.req(f"{name}{b}", ids))

    sub("a", q1, branches, 100_000)
    k.step()
    sub("b", q2, 2, 200_000)
    return lengths


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("policy", ["traversal-always", "radixflow"])
def test_a_second_question_waits_for_its_own_producer_behind_five_sharers(make_kit, model,
                                                                          policy):
    """Question 2's fork (the document + its 30-token stem) lies in the block where question 1
    leaves the document: question 1's 5 branches and question 2's first all share that block
    with question 2's second. It must find its own producer and wait for its fork, not run
    beside it recomputing the document (as stock does). Declared boundaries only: with the
    learned document end (the default) question 2 starts from the document's state (below)."""
    from radixflow_sglang.adapter.runtime import RadixFlowConfig

    q1, q2 = toks(7000, 10), toks(8000, 30)
    assert (len(DOC) + 10) // 64 == (len(DOC) + 30) // 64  # one block (index block 64)
    ks = make_kit(model, "no_buffer", "stock")
    two_questions(ks, 5, q1, q2)
    ks.drain()
    stock = ks.rounds
    cfg = RadixFlowConfig(policy=policy, boundaries="declared")
    k = make_kit(model, "no_buffer", policy, radixflow_config=cfg)
    lengths = two_questions(k, 5, q1, q2)
    k.drain()
    trav = k.rounds
    fork1, fork2 = len(DOC) + len(q1), len(DOC) + len(q2)
    got = first_prefix(trav)
    assert [got[f"a{b}"] for b in range(1, 5)] == [fork1] * 4
    assert got["b1"] == fork2  # waited for b0's fork
    # every prompt once; question 2 computes the document again (no state inside it)
    declared = tokens(trav)
    assert declared == sum(lengths.values()) - 4 * fork1 - fork2
    assert declared < tokens(stock)
    assert k.leaks() == NO_LEAK and ks.leaks() == NO_LEAK
    # the default learns the document end from question 1's split: question 2's first is cut
    # there (a state later questions on the document reuse) and its second waits for it
    kd = make_kit(model, "no_buffer", policy)
    two_questions(kd, 5, q1, q2)
    kd.drain()
    assert first_prefix(kd.rounds)["b1"] == len(DOC)
    assert tokens(kd.rounds) < tokens(stock) and kd.leaks() == NO_LEAK


def prod(rid: str, ids: list[int]) -> Producer:
    return Producer(rid, None, ids, 0, len(ids), len(ids), True)


def test_sharers_of_one_block_do_not_hide_the_newest_producer():
    """Five producers share the deepest block with the query; the newest shares the most."""
    idx = ProducerIndex(block=64)
    for b in range(5):
        idx.add(prod(f"a{b}", DOC + toks(7000, 10) + toks(100_000 + 100 * b, 20)))
    newest = DOC + toks(8000, 30) + toks(200_000, 20)
    idx.add(prod("b0", newest))
    query = DOC + toks(8000, 30) + toks(200_100, 21)
    hits = idx.sharers(None, query, exclude="b1")
    assert hits[0][0].rid == "b0" and hits[0][1] == common_prefix(query, newest) == 2030
    assert all(n == len(DOC) for _, n in hits[1:])


@pytest.mark.parametrize("model", MODELS)
def test_a_producers_last_chunk_is_cut_at_its_late_siblings_fork(make_kit, model):
    """P's document is longer than the budget: its last chunk runs in round 2, when its
    sibling S arrives. The last chunk is cut at their fork (it becomes the chunked request
    again) and S waits for it, instead of recomputing the document beside it."""
    budget = 1024
    k = make_kit(model, "no_buffer", "traversal-always", tokens=budget)
    p, s = DOC[:1500] + toks(5000, 100), DOC[:1500] + toks(6000, 120)
    k.submit(k.req("P", p))
    assert k.step().chunked == "P"
    k.submit(k.req("S", s))
    r2 = k.step()
    assert r2.rids == ["P"] and r2.chunked == "P" and r2.prefix["P"] + r2.extend["P"] == 1500
    k.drain()
    assert first_prefix(k.rounds)["S"] == 1500
    assert tokens(k.rounds) == len(p) + len(s) - 1500
    assert k.leaks() == NO_LEAK


def question(k, name: str, doc_len: int, start: int) -> list:
    doc = toks(start, doc_len)
    return [k.req(f"{name}{b}", doc + toks(300_000 + start + 40 * b, 30)) for b in range(4)]


@pytest.mark.parametrize("later", [True, False])
def test_a_short_wait_does_not_take_the_chunk_slot_from_a_long_document(make_kit, monkeypatch,
                                                                       later):
    """A RACE-like question r (280-token document) and a QuALITY-like question q (2,900) arrive
    together, r first (qwen3.5-27b, alpha 25 ms, 32 requests/s arriving). r's siblings' wait
    wins on its own, but its fork cut takes SGLang's one chunk slot: q's first then ran whole,
    its second recomputed the document beside it and its third once more a round later (9,220
    tokens). Priced (adapter/slot.py), r recomputes its 280 tokens and q's siblings wait for
    q's fork (4,260). Alone, r still waits."""
    from eval.costmodel import cost_with
    from radixflow_sglang.adapter import slot

    def run():
        k = make_kit("qwen3.5-27b", "no_buffer", "radixflow")
        k.runtime.use_prior(cost_with("qwen3.5-27b", alpha_ms=25))
        k.submit(*question(k, "r", 280, 1000))
        if later:
            k.submit(*question(k, "q", 2900, 20_000))
        # NOTE: the rate the wait rule reads (agreed per forward)
        k.runtime.roundcost.arrival_rate = 32.0
        k.drain()
        assert k.leaks() == NO_LEAK
        return [(r.rids, r.chunked) for r in k.rounds if r.mode == "prefill"], tokens(k.rounds)

    rounds, spent = run()
    if not later:
        assert rounds == [(["r0"], "r0"), (["r0", "r1", "r2", "r3"], None)]
        return
    assert rounds == [(["r0", "r1", "r2", "r3", "q0"], "q0"), (["q0", "q1", "q2", "q3"], None)]
    assert spent == 4 * 310 + 2900 + 4 * 30
    monkeypatch.setattr(slot, "priced", lambda rt, scan, sched, req, b, view: view)
    unpriced, more = run()
    assert unpriced[0] == (["r0", "q0", "q1"], "r0")  # q1 recomputes the document beside q0
    assert more > spent + 2900  # the document at least once more
