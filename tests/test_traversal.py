"""State-ready traversal on SGLang's real scan, pools and cache (issue: traversal).

Every case is run for Qwen3.5-4B (GDN, G = 64) and Nemotron-H 9B (Mamba2, G = 128 here) in
both mamba layouts, and for Qwen3-8B (full attention) where it means something. Expected
depths are computed from the model's grid and the shared length, never typed in.
"""

from __future__ import annotations

import json
import math
import random

import pytest

from radixflow_sglang.adapter.queueindex import QueueIndex
from radixflow_sglang.config import RadixFlowConfig
from radixflow_sglang.core.reasons import Reason, ablating
from radixflow_sglang.testing.fixtures import NO_LEAK, coverage_errors, toks

DOC = list(range(1000, 3000))  # 2,000 shared tokens
CASES = [
    pytest.param("qwen3.5-4b", "extra_buffer", id="qwen3.5-4b-extra_buffer"),
    pytest.param("qwen3.5-4b", "no_buffer", id="qwen3.5-4b-no_buffer"),
    pytest.param("nemotron-9b", "extra_buffer", id="nemotron-9b-extra_buffer"),
    pytest.param("nemotron-9b", "no_buffer", id="nemotron-9b-no_buffer"),
    pytest.param("qwen3-8b", "full", id="qwen3-8b-full"),
]
# overlap scheduling exists only with extra_buffer (SGLang forces it off for no_buffer)
OVERLAP_CASES = [c for c in CASES if c.values[1] != "no_buffer"]
# KV pages (issue 13 item 11): no_buffer exists only at page 1 in SGLang; page 128 moves
# Qwen's checkpoint grid to lcm(64, 128)
PAGED = [pytest.param(*c.values, 1, id=c.id) for c in CASES] + [
    pytest.param(m, lay, page, id=f"{m}-{lay}-page{page}")
    for m, lay in [("qwen3.5-4b", "extra_buffer"), ("nemotron-9b", "extra_buffer"),
                   ("qwen3-8b", "full")]
    for page in (16, 64)] + [
    pytest.param("qwen3.5-4b", "extra_buffer", 128, id="qwen3.5-4b-extra_buffer-page128")]


def kit(make_kit, model, layout, policy, **cfg):
    if policy == "radix":
        # NOTE: radix is the stock-equivalence check of the copied scan: no learned boundary
        # (a RadixFlow publication) may run there
        from radixflow_sglang.adapter.runtime import RadixFlowConfig

        cfg.setdefault("radixflow_config", RadixFlowConfig(policy="radix", boundaries="declared"))
    k = make_kit(model, "extra_buffer" if layout == "full" else layout, policy, **cfg)
    if k.runtime is not None:
        assert k.runtime.grid.layout.value == layout
        assert k.runtime.grid.size == grid_of(k, layout)
    return k


def grid_of(k, layout: str) -> int:
    """SGLang's checkpoint grid: lcm(the model's chunk, the page); full attention: the page."""
    page = k.cfg.page_size
    return page if layout == "full" else math.lcm(k.geometry.grid, page)


def fork_at(k, layout: str, common: int) -> int:
    """Where the producer publishes for a consumer sharing `common` tokens with it."""
    if layout == "no_buffer":
        return common  # the divergence as a chunk end (SGLang: page 1 only)
    g = grid_of(k, layout)  # extra_buffer: on the grid; full attention: whole pages
    return common // g * g


def waits(k):
    return k.runtime.traversal.waits


def round_hits(rounds) -> list[int]:
    """Each round's real cache hits: a row's prefix less the chunks its request computed itself
    (no retraction here)."""
    end: dict[str, int] = {}
    out = []
    for rnd in rounds:
        out.append(sum(rnd.prefix[rid] - end.get(rid, 0) for rid in rnd.rids))
        end.update({rid: rnd.prefix[rid] + rnd.extend[rid] for rid in rnd.rids})
    return out


# --- Figure 1: producer, consumer, independent work ------------------------------------------


@pytest.mark.parametrize("model, layout, page", PAGED)
def test_figure1_consumer_waits_one_round_and_hits_the_fork(make_kit, model, layout, page):
    p, a, d = DOC + toks(5000, 100), DOC + toks(6000, 120), toks(20_000, 300)
    k = kit(make_kit, model, layout, "traversal", page_size=page)
    k.submit(k.req("P", p), k.req("A", a), k.req("D", d))
    fork = fork_at(k, layout, len(DOC))
    r1 = k.step()
    assert r1.rids == ["P", "D"]  # A waits, independent D fills the round
    assert [r.rid for r in k.sched.waiting_queue] == ["A"] and "A" in waits(k)
    st = k.runtime.stats
    assert (st.blocked, st.forks, st.wait_set, st.rows) == (1, int(layout != "full"), 1, 2)
    assert st.scheduled_tokens == r1.scheduled_tokens
    if layout == "extra_buffer":
        assert r1.track["P"] == fork  # publishes at the fork, not its own end
        assert r1.extend["P"] == len(p)
    elif layout == "no_buffer":
        assert r1.extend["P"] == fork and r1.chunked == "P"  # its extend ends at the fork
    r2 = k.step()
    assert "A" in r2.rids and r2.prefix["A"] == fork
    assert r2.extend["A"] == len(a) - fork
    assert not waits(k) and k.runtime.stats.blocked == 0
    rounds = [r1, r2] + k.drain()
    assert coverage_errors(rounds, {"P": len(p), "A": len(a), "D": len(d)}) == []
    assert sum(r.scheduled_tokens for r in rounds) == len(p) + len(a) + len(d) - fork
    assert k.leaks() == NO_LEAK


@pytest.mark.parametrize("model, layout, page", PAGED)
def test_figure1_stock_admits_the_consumer_at_once_and_recomputes(make_kit, model, layout,
                                                                  page):
    p, a, d = DOC + toks(5000, 100), DOC + toks(6000, 120), toks(20_000, 300)
    k = kit(make_kit, model, layout, "stock", page_size=page)
    k.submit(k.req("P", p), k.req("A", a), k.req("D", d))
    r1 = k.step()
    assert r1.rids == ["P", "A", "D"] and r1.prefix == {"P": 0, "A": 0, "D": 0}
    assert r1.scheduled_tokens == len(p) + len(a) + len(d)


# --- four-branch request ---------------------------------------------------------------------


def four_branch(k, n=4):
    doc, q = DOC, toks(3000, 30)
    reqs = [k.req(f"b{i}", doc + q + toks(10 * i + 5, 20)) for i in range(n)]
    k.submit(*reqs)
    k.submit(k.req("D", toks(50_000, 500)))
    lengths = {r.rid: len(r.origin_input_ids) for r in reqs} | {"D": 500}
    return len(doc) + len(q), lengths


@pytest.mark.parametrize("model, layout, page", PAGED)
def test_four_branch_document_computed_once(make_kit, model, layout, page):
    ks = kit(make_kit, model, layout, "stock", page_size=page)
    common, lengths = four_branch(ks)
    stock = ks.drain()
    kt = kit(make_kit, model, layout, "traversal", page_size=page)
    four_branch(kt)
    trav = kt.drain()
    fork = fork_at(kt, layout, common)
    total = sum(lengths.values())
    stock_tokens = sum(r.scheduled_tokens for r in stock)
    trav_tokens = sum(r.scheduled_tokens for r in trav)
    assert stock_tokens == total  # every branch recomputes the shared 2,030 tokens
    assert trav_tokens == total - 3 * fork  # the document once, each branch only its suffix
    assert trav[0].rids == ["b0", "D"]
    for rid in ("b1", "b2", "b3"):
        assert trav[1].prefix[rid] == fork
    assert coverage_errors(stock, lengths) == [] and coverage_errors(trav, lengths) == []
    assert ks.leaks() == NO_LEAK and kt.leaks() == NO_LEAK
    # counters agree with the rounds
    tot = kt.runtime.totals
    assert tot.scheduled_tokens == trav_tokens
    assert tot.hit_tokens == sum(round_hits(trav))
    assert tot.blocked == 3 and tot.forks == int(layout != "full")
    assert tot.parked_max_rounds == 1 and tot.released_by_bound == 0
    assert tot.rounds >= len(trav)


# --- radix is stock, round by round ----------------------------------------------------------


def random_workload(seed: int):
    rng = random.Random(seed)
    reqs, base = [], 100_000
    for d in range(rng.randint(2, 4)):
        doc = toks(base, rng.randint(60, 2200))
        base += 3000
        for b in range(rng.randint(1, 4)):
            reqs.append((f"d{d}b{b}", doc + toks(base, rng.randint(1, 250))))
            base += 300
    for u in range(rng.randint(1, 4)):
        reqs.append((f"u{u}", toks(base, rng.randint(10, 1200))))
        base += 2000
    rng.shuffle(reqs)
    return reqs, rng.choice([256, 512, 1024, 2048]), rng.choice([4, 16, None])


def run_workload(k, seed: int, reqs):
    """Requests trickle in (0-3 per step, seeded), then the kit drains."""
    rng = random.Random(seed + 10_000)
    pending = list(reqs)
    for _ in range(10_000):
        if pending:
            n = rng.randint(0, 3)
            k.submit(*[k.req(rid, ids) for rid, ids in pending[:n]])
            pending = pending[n:]
        elif not (k.sched.waiting_queue or k.sched.chunked_req or k.sched.result_queue):
            return k.rounds
        k.step()
    raise AssertionError("workload did not drain")


def shape(rounds):
    return [(r.rids, r.extend, r.prefix, r.track, r.chunked) for r in rounds]


SEEDS = range(5)


@pytest.mark.parametrize("model, layout, overlap", [
    pytest.param(*c.values, False, id=c.id) for c in CASES] + [
    pytest.param(*c.values, True, id=c.id + "-overlap") for c in OVERLAP_CASES])
def test_radix_equals_stock_round_by_round(make_kit, model, layout, overlap):
    chunked = 0
    for seed in SEEDS:
        reqs, tokens, rows = random_workload(seed)
        out = {}
        for policy in ("stock", "radix"):
            k = kit(make_kit, model, layout, policy, tokens=tokens, rows=rows, overlap=overlap)
            out[policy] = shape(run_workload(k, seed, reqs))
            assert k.leaks() == NO_LEAK, (seed, policy)
            assert coverage_errors(k.rounds, {r: len(i) for r, i in reqs}) == []
        assert out["radix"] == out["stock"], seed
        chunked += sum(1 for r in out["stock"] if r[4] is not None)
    assert chunked > 0  # the budgets did force chunking


class _Schedule:
    """`get_schedule()` with prefill_max_requests overridden; every other field upstream's."""

    def __init__(self, inner, prefill_max_requests: int) -> None:
        self._inner, self.prefill_max_requests = inner, prefill_max_requests

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


@pytest.mark.parametrize("model, layout", [CASES[0], CASES[1], CASES[4]])
def test_radix_equals_stock_under_patched_scheduler_globals(make_kit, monkeypatch, model,
                                                            layout):
    """Issue 13 item 9: SGLang's tests patch sglang.srt.managers.scheduler's globals; the
    copied scan must read them there too (it once imported them by value)."""
    import sglang.srt.managers.scheduler as sched_mod

    import radixflow_sglang.adapter.scan  # noqa: F401  NOTE: loaded before the patch
    schedule, stamp = sched_mod.get_schedule, sched_mod.set_time_batch
    stamped: list[list[str]] = []
    monkeypatch.setattr(sched_mod, "get_schedule", lambda: _Schedule(schedule(), 1))
    monkeypatch.setattr(sched_mod, "set_time_batch", lambda reqs, name: (
        stamped.append([r.rid for r in reqs]), stamp(reqs, name))[1])
    for seed in range(3):
        reqs, tokens, rows = random_workload(seed)
        out = {}
        for policy in ("stock", "radix"):
            stamped.clear()
            k = kit(make_kit, model, layout, policy, tokens=tokens, rows=rows)
            out[policy] = shape(run_workload(k, seed, reqs))
            assert stamped == [r[0] for r in out[policy]]  # the patched stamp saw every round
            assert k.leaks() == NO_LEAK, (seed, policy)
        assert all(len(r[0]) <= 1 for r in out["stock"])  # the patch took effect
        assert out["radix"] == out["stock"], seed


def test_radix_honours_a_patched_test_retract(make_kit, monkeypatch):
    """TEST_RETRACT with a no-prefill batch size of -1: every scan returns without a batch."""
    import sglang.srt.managers.scheduler as sched_mod

    import radixflow_sglang.adapter.scan  # noqa: F401  NOTE: loaded before the patch
    monkeypatch.setattr(sched_mod, "TEST_RETRACT", True)
    monkeypatch.setattr(sched_mod, "TEST_RETRACT_NO_PREFILL_BS", -1)
    for policy in ("stock", "radix"):
        k = make_kit(policy=policy)
        k.submit(k.req("A", toks(1000, 100)))
        assert [k.step() for _ in range(3)] == [None] * 3, policy
        assert [r.rid for r in k.sched.waiting_queue] == ["A"]


def test_the_copied_scan_reads_the_upstream_module_namespace():
    import sglang.srt.managers.scheduler as sched_mod

    from radixflow_sglang.adapter import scan
    from radixflow_sglang.adapter import scheduler as ours

    assert scan.get_new_batch_prefill_raw.__globals__ is sched_mod.__dict__
    assert ours.get_new_batch_prefill_raw is scan.get_new_batch_prefill_raw  # what it calls


@pytest.mark.parametrize("model, layout", CASES)
@pytest.mark.parametrize("policy", ["stock", "radix", "traversal"])
def test_no_slot_leaks_after_drain(make_kit, model, layout, policy):
    for seed in range(3):
        reqs, tokens, rows = random_workload(seed)
        k = kit(make_kit, model, layout, policy, tokens=tokens, rows=rows)
        run_workload(k, seed, reqs)
        assert set(k.finished) == {rid for rid, _ in reqs}
        assert k.leaks() == NO_LEAK, seed
        if k.runtime is not None and k.runtime.traversal is not None:
            assert len(waits(k)) == 0




@pytest.mark.parametrize("model, layout", CASES)
def test_traversal_computes_every_prompt_exactly_once(make_kit, model, layout):
    errors = {}
    for seed in range(10):  # seed 8 shows the no_buffer bug in both models (3 too for Qwen)
        reqs, tokens, rows = random_workload(seed)
        k = kit(make_kit, model, layout, "traversal", tokens=tokens, rows=rows)
        run_workload(k, seed, reqs)
        err = coverage_errors(k.rounds, {rid: len(ids) for rid, ids in reqs})
        if err:
            errors[seed] = err
    assert errors == {}


@pytest.mark.parametrize("model", ["qwen3.5-4b", "nemotron-9b"])
def test_no_buffer_forked_producer_is_not_displaced_by_a_native_chunk(make_kit, model):
    k = kit(make_kit, model, "no_buffer", "traversal", tokens=4096)
    p, a, d = DOC + toks(5000, 100), DOC + toks(6000, 120), toks(20_000, 3000)
    k.submit(k.req("P", p), k.req("A", a), k.req("D", d))
    rounds = k.drain()
    assert coverage_errors(rounds, {"P": len(p), "A": len(a), "D": len(d)}) == []
    assert k.leaks() == NO_LEAK


@pytest.mark.parametrize("model, layout", CASES)
def test_theta_from_the_config_sets_the_minimum_gain(make_kit, model, layout):
    from radixflow_sglang.adapter.runtime import RadixFlowConfig

    p, a = DOC + toks(5000, 100), DOC + toks(6000, 120)
    for theta, waits_for_p in ((len(DOC) + 1, False), (len(DOC) // 2, True)):
        k = make_kit(model, "extra_buffer" if layout == "full" else layout, "traversal",
                     radixflow_config=RadixFlowConfig(policy="traversal", theta=theta))
        assert k.runtime.traversal.cfg.theta == theta
        k.submit(k.req("P", p), k.req("A", a))
        r1 = k.step()
        assert (r1.rids == ["P"]) == waits_for_p, theta
        assert k.runtime.stats.blocked == int(waits_for_p)




@pytest.mark.parametrize("model, layout", CASES)
def test_aborting_a_parked_consumer_drops_its_records(make_kit, model, layout):
    k = kit(make_kit, model, layout, "traversal")
    k.submit(k.req("P", DOC + toks(5000, 100)), k.req("A", DOC + toks(6000, 120)))
    k.step()
    assert "A" in waits(k) and "A" in k.runtime.requests
    k.abort_waiting("A")
    assert "A" not in waits(k) and "A" not in waits(k).total_rounds
    assert "A" not in k.runtime.requests and not k.sched.waiting_queue
    k.drain()
    assert set(k.finished) == {"P"} and k.leaks() == NO_LEAK


# --- native selection minus Blocked is kept ----------------------------------------------------


def warm_and_queue(seed: int):
    rng = random.Random(seed)
    base, warm, queue = 100_000, [], []
    for d in range(rng.randint(2, 4)):
        doc = toks(base, rng.randint(100, 1500))
        base += 2000
        if rng.random() < 0.5:
            warm.append((f"w{d}", doc[: rng.randint(64, len(doc))]))
        for b in range(rng.randint(1, 4)):
            queue.append((f"d{d}b{b}", doc + toks(base, rng.randint(1, 200))))
            base += 300
    for u in range(rng.randint(1, 4)):
        queue.append((f"u{u}", toks(base, rng.randint(10, 900))))
        base += 1000
    rng.shuffle(queue)
    return warm, queue, rng.choice([512, 1024, 2048, 4096]), rng.choice([4, 16, 64])


# NOTE: the slot exception of the design's Proposition 2: a cut holds SGLang's one chunk slot,
# and a request whose own cut would need it is deferred this round
SLOT_DEFERRALS = {"boundary_slot", "fork_slot"}


def slot_deferred(trace) -> set[str]:
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    return {e["rid"] for e in events if e["event"] == "defer" and e["reason"] in SLOT_DEFERRALS}


def reordered(trace) -> bool:
    """ORDER's `published_first` moved requests in this scan."""
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    return any(e["event"] == "order" and e["reason"] == "published_first" for e in events)


@pytest.mark.parametrize("model, layout", CASES)
def test_native_selection_minus_blocked_is_a_subset(make_kit, model, layout, tmp_path):
    blocked_seen = 0
    for seed in range(6):
        warm, queue, tokens, rows = warm_and_queue(seed)
        sel, blocked = {}, set()
        trace = tmp_path / f"{seed}.jsonl"
        for policy in ("stock", "traversal"):
            cfg = {} if policy == "stock" else {
                "radixflow_config": RadixFlowConfig(policy=policy, trace=str(trace))}
            k = kit(make_kit, model, layout, policy, tokens=tokens, rows=rows, **cfg)
            for rid, ids in warm:  # the same cache state in both kits (no sharing: no waits)
                k.submit(k.req(rid, ids))
                k.drain()
            k.submit(*[k.req(rid, ids) for rid, ids in queue])
            batch = k.scan()
            sel[policy] = {r.rid for r in batch.reqs} if batch is not None else set()
            if policy == "traversal":
                blocked = set(waits(k).rids())
                assert k.runtime.stats.blocked == len(blocked)
        assert not blocked & sel["traversal"]
        kept = sel["stock"] - blocked - slot_deferred(trace)
        if reordered(trace):
            # NOTE: ORDER's `published_first` (rows bind): published requests of the pass took
            # the rows first; the round is no smaller, a different set of the same pass
            assert len(kept) <= len(sel["traversal"]), seed
        else:
            assert kept <= sel["traversal"], seed
        blocked_seen += len(blocked)
    assert blocked_seen > 0


# --- parked requests hold nothing ------------------------------------------------------------


def check_waiting_holds_nothing(k) -> tuple[int, int]:
    """(parked requests whose probe found a ready state, visited-but-rejected requests)."""
    parked = set(waits(k).rids()) if k.runtime is not None and k.runtime.traversal else set()
    hot = rejected = 0
    for r in k.sched.waiting_queue:
        assert r.kv.mamba_cow_src_index is None, r.rid  # no stale copy-on-write source
        assert not r.kv.mamba_needs_clear, r.rid
        assert not r.kv.holds_mamba, r.rid
        assert not r.kv.holds_kv, r.rid
        if r.rid in parked:
            hot += r.prefix_len > 0  # a native match here would have staged a COW source
        elif r.last_node is not None and r.prefix_len > 0:
            rejected += 1  # matched (COW staged), then reverted by the scan
    return hot, rejected


def sibling_workload(k, chunking: bool, side_by_side: bool):
    """States published at 5G + 3 inside three documents, then siblings arriving in pairs."""
    g = k.geometry.grid
    for i in range(3):
        k.submit(k.req(f"w{i}", toks(100_000 * (i + 1), 5 * g + 3)))
        k.drain()
    if not chunking:
        k.sched.chunked_prefill_size = None  # Scheduler.__init__'s reading of -1
    rng = random.Random(7)
    pending = [(f"d{i}b{b}", toks(100_000 * (i + 1), 1200)
                + toks(900_000 + 1000 * (3 * i + b), rng.randint(5, 300)))
               for i in range(3) for b in range(3)]
    if side_by_side:  # different documents in the same round instead of siblings
        pending = [pending[3 * i + b] for b in range(3) for i in range(3)]
    pending.append(("u0", toks(2_000_000, 1500)))
    hot = rejected = 0
    while pending or k.sched.waiting_queue or k.sched.chunked_req or k.sched.result_queue:
        k.submit(*[k.req(rid, ids) for rid, ids in pending[:2]])
        pending = pending[2:]
        k.step()
        h, r = check_waiting_holds_nothing(k)
        hot, rejected = hot + h, rejected + r
    assert k.leaks() == NO_LEAK
    return hot, rejected


@pytest.mark.parametrize("model, layout", [c for c in CASES if c.values[1] != "full"])
@pytest.mark.parametrize("policy", ["stock", "traversal-always"])  # NOTE: parking must happen
def test_parked_requests_hold_no_slot_and_no_copy_on_write_source(make_kit, model, layout,
                                                                   policy):
    k = kit(make_kit, model, layout, policy, tokens=4096, kv_tokens=4000)
    hot, _ = sibling_workload(k, chunking=True, side_by_side=False)
    if policy != "stock":
        assert hot > 0 and k.runtime.totals.blocked > 0


@pytest.mark.parametrize("model", ["qwen3.5-4b", "nemotron-9b"])
@pytest.mark.parametrize("policy", ["stock", "traversal"])
def test_rejected_requests_keep_no_stale_copy_on_write_source(make_kit, model, policy):
    """Chunking off: over-budget requests are matched (COW source staged) and rejected."""
    k = kit(make_kit, model, "extra_buffer", policy, tokens=1000)
    _, rejected = sibling_workload(k, chunking=False, side_by_side=True)
    assert rejected > 0


@pytest.mark.parametrize("model", ["qwen3.5-4b", "nemotron-9b"])
def test_no_buffer_fork_with_chunked_prefill_disabled(make_kit, model):
    k = kit(make_kit, model, "no_buffer", "traversal")
    k.sched.chunked_prefill_size = None  # Scheduler.__init__'s reading of -1
    p, a = DOC + toks(5000, 100), DOC + toks(6000, 120)
    k.submit(k.req("P", p), k.req("A", a))
    rounds = k.drain()
    assert coverage_errors(rounds, {"P": len(p), "A": len(a)}) == []
    assert k.leaks() == NO_LEAK


# --- bounded parking, retracted producers, overlap --------------------------------------------


@pytest.mark.parametrize("overlap", [True, False])
def test_kit_a_chain_of_waits_the_bound_would_cut_recomputes_with_its_producer(make_kit, overlap):
    """SGLang's real scan (qwen3.5-4b, G = 64, cost-aware, a 2 ms round): the first of four
    branches declares its boundary at G, below their fork at 2G. The three others wait for it;
    released at G, the second publishes at 2G and the last two are Blocked on it. Under overlap
    its state comes 2 rounds later and the bound (3 rounds) leaves them 1: they recompute from
    G beside it (traced on nemotron-9b race, alpha 8 ms, overlap: they parked one round more,
    then the bound released them to recompute the same tokens). Without overlap the wait fits
    the bound: they wait and resume at 2G."""
    from radixflow_sglang.adapter.runtime import RadixFlowConfig
    from radixflow_sglang.core.cost import CostCoeffs

    k = make_kit("qwen3.5-4b", "extra_buffer", "radixflow", overlap=overlap,
                 radixflow_config=RadixFlowConfig(policy="radixflow", boundaries="declared"))
    k.runtime.use_prior(CostCoeffs(0.002, 2e-5, 1e-4))
    G = k.runtime.grid.size
    doc = list(range(1000, 1000 + 2 * G + 5))
    k.submit(*[k.req(f"b{i}", doc + list(range(50_000 + 100 * i, 50_040 + 100 * i)),
                     **({"boundary": G} if i == 0 else {})) for i in range(4)])
    rounds = [(sorted(r.rids), sorted(r.prefix.values())) for r in k.drain()]
    if overlap:
        assert rounds == [(["b0"], [0]), (["b1", "b2", "b3"], [G] * 3)]
        assert k.runtime.totals.recomputed == 2
    else:
        assert rounds == [(["b0"], [0]), (["b1"], [G]), (["b2", "b3"], [2 * G] * 2)]
    assert k.runtime.totals.released_by_bound == 0
    assert k.leaks() == NO_LEAK


@pytest.mark.parametrize("model, layout", OVERLAP_CASES)
def test_parking_is_bounded_when_the_producer_never_publishes(make_kit, model, layout):
    k = kit(make_kit, model, layout, "traversal", overlap=True)
    p, a = DOC + toks(5000, 100), DOC + toks(6000, 120)
    k.submit(k.req("P", p), k.req("A", a))
    r1 = k.step()
    assert r1.rids == ["P"] and len(k.sched.result_queue) == 1  # P in flight
    bound = k.runtime.traversal.cfg.max_park_rounds
    assert bound == 2 + k.runtime.cfg.park_margin  # publish lag 2 under overlap, + margin
    batch = None
    for _ in range(bound - 1):  # P's result is never processed: it stays in flight
        batch = k.scan()
        assert batch is None and "A" in waits(k)
    batch = k.scan()  # the bound is spent: native handling admits A with what is there
    assert [r.rid for r in batch.reqs] == ["A"] and batch.reqs[0].prefix_len == 0
    assert "A" not in waits(k).total_rounds  # selected: its history ended (parked_max below)
    assert k.runtime.totals.released_by_bound == 1
    assert k.runtime.totals.parked_max_rounds == bound
    k.sched.result_queue.append((batch, None))
    k.drain()
    assert set(k.finished) == {"P", "A"} and k.leaks() == NO_LEAK


@pytest.mark.parametrize("model, layout", OVERLAP_CASES)
def test_retracted_producer_releases_its_consumers(make_kit, model, layout):
    from sglang.srt.mem_cache.common import release_kv_cache

    k = kit(make_kit, model, layout, "traversal", overlap=True)
    p, a = DOC + toks(5000, 100), DOC + toks(6000, 120)
    preq = k.req("P", p)
    k.submit(preq, k.req("A", a), k.req("D", toks(20_000, 300)))
    r1 = k.step()
    assert r1.rids == ["P", "D"] and "A" in waits(k)
    # SGLang's retraction (schedule_batch.release_req): free without inserting, reset
    release_kv_cache(preq, k.pools.cache, checkpoint=False)
    preq.reset_for_retract()
    r2 = k.step()  # P's batch is still in flight, but P will publish nothing
    assert r2 is not None and r2.rids == ["A"] and r2.prefix["A"] == 0
    assert k.runtime.stats.blocked == 0 and "A" not in waits(k)
    k.drain()
    assert "P" not in k.finished and k.leaks() == NO_LEAK


@pytest.mark.parametrize("model, layout", OVERLAP_CASES)
def test_overlap_consumer_parks_two_rounds_then_hits(make_kit, model, layout):
    k = kit(make_kit, model, layout, "traversal", overlap=True)
    p, a = DOC + toks(5000, 100), DOC + toks(6000, 120)
    k.submit(k.req("P", p), k.req("A", a), k.req("D", toks(20_000, 300)))
    fork = fork_at(k, layout, len(DOC))
    r1 = k.step()
    assert r1.rids == ["P", "D"]
    assert k.step() is None  # P in flight (not yet published): A parks again
    assert waits(k).get("A").rounds == 2
    assert k.runtime.stats.blocked == 1 and k.runtime.stats.forks == 0  # in flight: not moved
    r3 = k.step()
    assert r3.rids == ["A"] and r3.prefix["A"] == fork
    assert "A" not in waits(k).total_rounds and k.runtime.totals.parked_max_rounds == 2
    k.drain()
    assert k.leaks() == NO_LEAK


@pytest.mark.parametrize("model, layout", OVERLAP_CASES)
def test_overlap_late_sibling_waits_for_the_in_flight_fork(make_kit, model, layout):
    k = kit(make_kit, model, layout, "traversal", overlap=True)
    k.submit(k.req("P", DOC + toks(5000, 100)), k.req("A", DOC + toks(6000, 120)))
    fork = fork_at(k, layout, len(DOC))
    k.step()
    k.submit(k.req("B", DOC + toks(7000, 90)))  # arrives while P is in flight
    assert k.step() is None
    assert {"A", "B"} <= set(waits(k).rids())
    r3 = k.step()
    assert r3.prefix == {"A": fork, "B": fork}


# --- namespaces, fork slots, counters ----------------------------------------------------------


@pytest.mark.parametrize("model, layout", CASES)
def test_other_namespace_never_waits(make_kit, model, layout):
    k = kit(make_kit, model, layout, "traversal")
    k.submit(k.req("P", DOC + toks(5000, 100), namespace="x"),
             k.req("A", DOC + toks(6000, 120), namespace="y"))
    r1 = k.step()
    assert r1.rids == ["P", "A"] and k.runtime.stats.blocked == 0


@pytest.mark.parametrize("model", ["qwen3.5-4b", "nemotron-9b"])
def test_no_buffer_forks_one_producer_per_round(make_kit, model):
    k = kit(make_kit, model, "no_buffer", "traversal")
    doc2 = toks(40_000, 1500)
    k.submit(k.req("P1", DOC + toks(5000, 100)), k.req("P2", doc2 + toks(5000, 100)),
             k.req("A1", DOC + toks(6000, 120)), k.req("A2", doc2 + toks(6000, 120)))
    r1 = k.step()
    assert r1.rids == ["P1", "P2", "A2"] and r1.chunked == "P1"
    assert r1.extend == {"P1": len(DOC), "P2": len(doc2) + 100, "A2": len(doc2) + 120}
    st = k.runtime.stats
    assert (st.blocked, st.forks) == (1, 1) and waits(k).rids() == ["A1"]
    r2 = k.step()
    assert r2.prefix["A1"] == len(DOC)


@pytest.mark.parametrize("model, layout", CASES)
def test_counters_agree_with_the_rounds(make_kit, model, layout):
    # bursts: a document's branches arrive together, with unrelated work in between
    bursts = [[(f"d{d}b{b}", toks(100_000 * (d + 1), n) + toks(900_000 + 1000 * (4 * d + b), 40))
               for b in range(4)] for d, n in enumerate((1500, 900, 2300))]
    bursts.insert(1, [("u0", toks(5_000_000, 700)), ("u1", toks(6_000_000, 50))])
    k = kit(make_kit, model, layout, "traversal", tokens=2048)
    scans = blocked = forks = parked_max = 0
    # NOTE: the traversal's own forks: a 2,048-token round takes no sibling beside its
    # producer, so PLACE `queued_fork` would move each producer at admission instead
    # (tests/test_boundary_queued.py)
    with ablating([Reason.QUEUED_FORK]):
        while bursts or k.sched.waiting_queue or k.sched.chunked_req or k.sched.result_queue:
            if bursts:
                k.submit(*[k.req(rid, ids) for rid, ids in bursts.pop(0)])
            before = k.runtime.totals.rounds
            rnd = k.step()
            parked_max = max([parked_max, *waits(k).total_rounds.values()])
            st = k.runtime.stats
            if k.runtime.totals.rounds == before:
                assert rnd is None  # no scan ran
                continue
            scans += 1
            blocked += st.blocked
            forks += st.forks
            assert st.visited == st.ready + st.blocked + st.other
            assert st.wait_set == len(waits(k)) >= st.blocked
            assert st.forks <= st.blocked
            if rnd is None:
                assert (st.rows, st.scheduled_tokens) == (0, 0)
            else:
                assert st.rows == len(rnd.rids)
                assert st.scheduled_tokens == rnd.scheduled_tokens
                assert st.hit_tokens == round_hits(k.rounds)[-1]
    tot = k.runtime.totals
    assert (tot.rounds, tot.blocked, tot.forks) == (scans, blocked, forks)
    assert blocked > 0 and (forks > 0) == (layout != "full")
    assert tot.scheduled_tokens == sum(r.scheduled_tokens for r in k.rounds)
    assert tot.hit_tokens == sum(round_hits(k.rounds))
    assert tot.parked_max_rounds == parked_max
    assert tot.released_by_bound == 0
    assert k.runtime.summary()["blocked"] == blocked


def test_selection_drops_what_only_a_queued_request_reads(make_kit):
    # NOTE: in a server nothing reports completion to the runtime: selection itself must drop
    # a request's wait history, fragment deferrals and boundary keys, or they grow with every
    # request ever parked (the kit no longer forgets on completion either)
    k = kit(make_kit, "qwen3.5-4b", "extra_buffer", "traversal")
    k.submit(k.req("P", DOC + toks(5000, 100)), k.req("A", DOC + toks(6000, 120)))
    assert k.step().rids == ["P"]
    rt = k.runtime
    assert rt.traversal.waits.total_rounds == {"A": 1} and rt.records.count() == 2
    assert [r.rid for r in k.scan().reqs] == ["A"]  # selected, not completed
    assert rt.traversal.waits.total_rounds == {} and rt.records.count() == 0
    assert "A" not in rt.boundary.keys and not rt.records.frag_deferred


def test_pruning_drops_the_records_of_requests_gone_unseen(make_kit):
    # NOTE: the sweep behind the hooks: a request registered and then gone by a path no hook
    # sees leaves a record until the next sweep
    k = kit(make_kit, "qwen3.5-4b", "extra_buffer", "timer10")
    k.submit(k.req("P", DOC + toks(5000, 100)))
    assert k.scan() is None  # held to its deadline: registered, not selected
    rt = k.runtime
    assert "P" in rt.requests
    k.sched.waiting_queue.clear()  # gone unseen: no abort hook ran
    k.submit(k.req("Q", toks(70_000, 200)))
    rt.records.sweep(QueueIndex(k.sched.waiting_queue), whole=True)
    assert "P" not in rt.requests and rt.records.count() == 0  # Q is not registered yet
    assert [r.rid for r in k.sched.waiting_queue] == ["Q"]  # the queue itself is untouched


@pytest.mark.parametrize("layout", ["extra_buffer", "no_buffer"])
def test_a_parked_request_gone_unseen_leaves_the_wait_set_next_scan(make_kit, layout):
    # NOTE: issue 50's leak: a parked request aborted without a hook kept its wait-set entry
    # forever, and every later scan lost its quiet path. SGLang's aborts call the hook
    # (test_aborting_a_parked_consumer_drops_its_records); this is the guard behind it.
    k = kit(make_kit, "qwen3.5-4b", layout, "traversal")
    k.submit(k.req("P", DOC + toks(5000, 100)), k.req("A", DOC + toks(6000, 120)))
    while "A" not in waits(k):
        assert k.step() is not None and k.sched.waiting_queue, "A never parked"
    a = next(r for r in k.sched.waiting_queue if r.rid == "A")
    k.sched.waiting_queue.remove(a)  # gone unseen (its slot: it holds none while parked)
    assert not a.kv.holds_mamba and "A" in waits(k)
    k.drain()
    quiet = k.runtime.totals.quiet_scans
    k.submit(k.req("B", toks(80_000, 300)))
    k.drain()
    assert len(waits(k)) == 0 and "A" not in waits(k).total_rounds
    assert k.runtime.totals.quiet_scans > quiet  # B's scan ran quiet again
    assert set(k.finished) == {"P"} | {"B"} and k.leaks() == NO_LEAK


# --- pages: +Frag deferral and the no_buffer cut ---------------------------------------------


def first_round(make_kit, model, policy, page, tokens, b_len):
    """a (2,000 tokens) then b (b_len): the first round that runs (admission holds skipped)."""
    now = [0.0]
    k = make_kit(model, "extra_buffer", policy, clock=lambda: now[0], page_size=page,
                 tokens=tokens)
    k.submit(k.req("a", toks(10_000, 2000)), k.req("b", toks(20_000, b_len)))
    for _ in range(4):
        rnd = k.step()
        if rnd is not None:
            return k, rnd
        now[0] += 1.0  # past any admission deadline
    raise AssertionError("no round ran")


@pytest.mark.parametrize("model", ["qwen3.5-4b", "nemotron-9b"])
@pytest.mark.parametrize("page", [16, 64])
def test_frag_defers_exactly_the_stateless_fragments_sglang_would_cut(make_kit, model, page):
    """+Frag skips b when, and only when, native admission cuts b into a chunk that publishes
    no state (0 < extend < G). SGLang fits a request on its page-ceiled extend and cuts on
    pages, so the raw residual budget is the wrong test: at page 16 a 50-token b 'fits' 60
    raw tokens but is cut to 48; at page 64 a residual below the page cuts nothing (native
    OTHER), which is no fragment."""
    charged_a = -(-2000 // page) * page  # the page-ceiled compute charge of a
    outcomes = set()
    for left in (40, 60, 100, 200):
        for b_len in (50, 300):
            _, native = first_round(make_kit, model, "radix", page, charged_a + left, b_len)
            k, frag = first_round(make_kit, model, "radixflow-frag", page, charged_a + left,
                                  b_len)
            g = k.runtime.grid.size
            cut = native.extend.get("b") if native.chunked == "b" else None
            fragment = cut is not None and 0 < cut < g
            outcomes.add((fragment, cut is None and "b" not in native.rids))
            case = (left, b_len, native.rids, native.extend, frag.rids)
            if fragment:
                assert frag.rids == [r for r in native.rids if r != "b"], case
                assert k.runtime.records.frag_deferred == {"b": 1}, case
                assert [r.rid for r in k.sched.waiting_queue] == ["b"], case
            else:
                assert frag.rids == native.rids and frag.extend == native.extend, case
                assert k.runtime.totals.frag_deferred == 0, case
            assert not any(r.kv.holds_mamba for r in k.sched.waiting_queue)
    assert (False, False) in outcomes
    # a cut on pages is 0 or >= page: with G == page no cut is ever a fragment
    assert ((True, False) in outcomes) == (math.lcm(k.geometry.grid, page) > page)
    if page == 64:
        assert (False, True) in outcomes  # a residual below the page: native cuts nothing


def test_the_kit_refuses_no_buffer_on_pages_as_sglang_does(make_kit):
    for page in (16, 64):
        with pytest.raises(ValueError, match="no_buffer only supports page_size=1"):
            make_kit("qwen3.5-4b", "no_buffer", "traversal", page_size=page)
    with pytest.raises(ValueError, match="KitConfig.page_size: 48"):
        make_kit("qwen3.5-4b", "extra_buffer", "stock", page_size=48)  # 48 vs 64: no divisor


@pytest.mark.parametrize("page", [1, 16, 64])
def test_grid_fork_depths_sit_on_pages(page):
    """Engine-free: every fork depth Grid offers is a page multiple past the producer's
    prefix, and the deepest such depth within reach (no_buffer cut; extra_buffer on the
    lcm grid; full attention whole pages)."""
    from radixflow_sglang.core.grid import Grid, Layout

    grids = [Grid(Layout.NO_BUFFER, 64, page), Grid(Layout.EXTRA_BUFFER, math.lcm(64, page),
                                                   page), Grid(Layout.FULL, page, page)]
    for g in grids:
        step = g.size if g.layout is not Layout.NO_BUFFER else page
        for prefix in (0, 4 * step):
            for reach in range(prefix - 3, prefix + 5 * step + 3, 7):
                d = g.fork_depth(prefix, 3 * step + 5, reach)
                end = prefix + 3 * step + 5
                best = min(reach, end) // step * step
                useful = d if d is not None and d > prefix else None  # FULL may say 0 / prefix
                assert useful == (best if best > prefix else None), (g, prefix, reach)
                assert d is None or d % page == 0
    with pytest.raises(ValueError, match="multiple of the page"):
        Grid(Layout.EXTRA_BUFFER, 64, 128)


def test_an_in_flight_sharer_past_reach_does_not_hide_a_usable_producer(make_kit):
    """Overlap: d0b1 (forked to publish at 640) and d0b0 (its last chunk publishes at 704,
    past the consumers' reach of 700) are both in flight and share the whole document with
    d0b2 / d0b3. The consumers parked on d0b1 must keep waiting for 640, not be released to
    the 512 state because the first sharer found (d0b0) is of no use."""
    k = kit(make_kit, "qwen3.5-4b", "extra_buffer", "traversal-always", rows=4, tokens=512,
            overlap=True)  # NOTE: parking must happen (the cost-aware rule may not wait here)
    doc = toks(100_000, 700)
    k.submit(*[k.req(f"d0b{b}", doc + toks(200_000 + 100 * b, 40 + 7 * b)) for b in range(4)])
    waits_ = k.runtime.traversal.waits
    promised, got = {}, {}
    for _ in range(12):
        parked = {rid: waits_.get(rid).depth for rid in waits_.rids()}
        rnd = k.step()
        for rid in rnd.rids if rnd is not None else ():
            if rid in parked:
                promised[rid], got[rid] = parked[rid], rnd.prefix[rid]
    assert promised.get("d0b2") == promised.get("d0b3") == 640  # the case did arise
    assert got == promised
    k.drain()
    assert k.leaks() == NO_LEAK
