"""The witness executor: exact state checks on SGLang's real pools, and mutants it must catch.

Stock is the reference: SGLang's own scheduler passes the witness on every layout first; then
RadixFlow must pass it with identical output ids. Each mutant corrupts one thing a scheduler
change (or SGLang's track arithmetic) could get wrong; the witness must raise on each.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from radixflow_sglang.core.fingerprint import EMPTY, Fp, Hasher, kv_decode, kv_words
from radixflow_sglang.testing.exactness import run_exact
from radixflow_sglang.testing.kit import Kit, KitConfig

# --- the fingerprint (pure) ---------------------------------------------------------------


def test_advance_equals_from_scratch():
    h, rng = Hasher(), np.random.default_rng(0)
    toks = rng.integers(0, 1 << 28, 5000)  # NOTE: any id a KV slot can hold
    tab = h.table(toks)
    for a, b in ((0, 0), (0, 1), (1000, 1064), (1000, 5000)):
        assert tab.at(b) == h.of(toks[:b])
        assert tab.advance(h.of(toks[:a]), a, b) == h.of(toks[:b])
    assert h.step(h.of(toks[:10]), int(toks[10]), 10) == h.of(toks[:11])


def test_fingerprint_separates_order_depth_and_content():
    h = Hasher()
    a = h.of([5, 6, 7])
    assert a != h.of([6, 5, 7]) and a != h.of([5, 6]) and a != h.of([5, 6, 8])
    assert h.of([]) == EMPTY and h.of([0]) != EMPTY


def test_words_round_trip_and_a_cleared_slot_reads_none():
    fp = Fp((1 << 21) - 3, 16_777_000, 12_345)
    assert Fp.from_words(fp.words()) == fp
    assert Fp.from_words([0] * 7) is None
    assert all(0 <= w < (1 << 14) for w in fp.words())  # NOTE: no NaN/Inf bit pattern
    t, p = kv_decode(kv_words(np.array([0, 248_319]), np.array([0, 200_000])))
    assert t.tolist() == [0, 248_319] and p.tolist() == [0, 200_000]


def test_bad_executor_name_is_refused():
    with pytest.raises(ValueError, match="Kit.executor.*witness, scripted"):
        Kit(KitConfig(model="qwen3.5-0.8b"), executor="model")


# --- stock is the reference; radixflow computes the same ------------------------------------

CASES = [  # (model, layout, overlap, page_size, chunk tokens)
    ("qwen3.5-4b", "extra_buffer", False, 1, None),
    ("qwen3.5-4b", "extra_buffer", True, 1, 1024),
    ("qwen3.5-4b", "extra_buffer", True, 16, None),
    ("qwen3.5-4b", "no_buffer", False, 1, 1024),
    ("nemotron-9b", "extra_buffer", True, 1, 1024),
    ("nemotron-9b", "no_buffer", False, 1, None),
    ("qwen3-8b", "extra_buffer", True, 16, 1024),
]


@pytest.mark.parametrize("model,layout,overlap,page,tokens", CASES)
def test_stock_passes_and_radixflow_computes_the_same(model, layout, overlap, page, tokens):
    cfg = KitConfig(model=model, layout=layout, overlap=overlap, page_size=page, tokens=tokens)
    runs = {p: run_exact(p, cfg) for p in ("stock", "radixflow")}
    for run in runs.values():
        assert run.stats["mismatched"] == 0 and run.stats["requests"] == 24
        assert run.leaks == {"kv": 0, "rows": 0, "mamba": 0}
        assert run.stats["kv_checked"] > 0
        if model != "qwen3-8b":
            # NOTE: every decode step and every resumed prefix reads a state
            decodes = sum(len(o) - 1 for o in run.outputs.values())
            assert run.stats["resumed"] > 0
            assert run.stats["states_checked"] == decodes + run.stats["resumed"]
    assert runs["stock"].outputs == runs["radixflow"].outputs
    assert len({o for o in runs["stock"].outputs.values()}) > 20  # outputs depend on state


def test_the_witness_output_depends_on_the_state(monkeypatch):
    """The same run with one resumed state perturbed (not strict): outputs change."""
    from radixflow_sglang.adapter import witness as w

    cfg = KitConfig(model="qwen3.5-4b", overlap=False)
    clean = run_exact("stock", cfg).outputs
    real = w.Witness._read_state
    monkeypatch.setattr(w.Witness, "_read_state", lambda self, req, slot, expect, depth, what: (
        Fp(expect.n, (expect.h1 + 1) % 16_777_213, expect.h2) if what == "resumed state"
        else real(self, req, slot, expect, depth, what)))
    moved = run_exact("stock", cfg, strict=False)
    assert moved.stats["mismatched"] > 0
    assert sum(clean[r] != moved.outputs[r] for r in clean) >= moved.stats["mismatched"]


# --- mutants: each must be caught ------------------------------------------------------------


def _no_force_track_plus_one(monkeypatch):
    """SGLang's `_force_track_h` without its "+1": an aligned fork depth short of the extend's
    end then takes the last state (schedule_batch.py, hybrid_linear_attn_backend.py)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    real = ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend

    def mutant(self, req):
        entry = real(self, req)
        if entry.track_mask and entry.track_seqlen == req.kv.mamba_last_track_seqlen + 1:
            entry = entry._replace(track_seqlen=entry.track_seqlen - 1)
        return entry

    monkeypatch.setattr(ScheduleBatch, "_mamba_radix_cache_v2_req_prepare_for_extend", mutant)


def _publish_depth_off_by_one(monkeypatch):
    """The producer's published node is keyed one token short of the state its track slot
    holds (the depth its consumers resume from is off by one)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    real = ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend

    def mutant(self, req):
        entry = real(self, req)
        if entry.track_mask:
            req.kv.mamba_last_track_seqlen -= 1
        return entry

    monkeypatch.setattr(ScheduleBatch, "_mamba_radix_cache_v2_req_prepare_for_extend", mutant)


def _cow_source_freed_before_the_copy(monkeypatch):
    """The copy-on-write source slot is reused (cleared by its new owner) before the deferred
    copy runs on the forward stream."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    real = ScheduleBatch._collect_deferred_mamba_cow_and_clear

    def mutant(self, reqs):
        real(self, reqs)
        if self.mamba_cow_src_indices is not None:
            self.req_to_token_pool.mamba_pool.clear_slots(self.mamba_cow_src_indices)

    monkeypatch.setattr(ScheduleBatch, "_collect_deferred_mamba_cow_and_clear", mutant)


def _track_slot_swapped(monkeypatch):
    """The tree is handed the other ping-pong slot than the one the forward wrote."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    real = ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend

    def mutant(self, req):
        entry = real(self, req)
        if entry.track_mask:
            req.kv.mamba_last_track_idx = 1 - req.kv.mamba_last_track_idx
        return entry

    monkeypatch.setattr(ScheduleBatch, "_mamba_radix_cache_v2_req_prepare_for_extend", mutant)


def _consumer_resumed_before_its_producer(monkeypatch):
    """Forwards run out of launch order: an extend's forward runs after the next batch's, so a
    consumer admitted on the producer's just-stashed state reads it before it is written."""
    held: list = []
    real = Kit.launch

    def snapshot(batch):
        keys = ("forward_mode", "reqs", "prefix_lens", "extend_lens", "seq_lens_cpu",
                "mamba_prefill_track_mask_cpu", "mamba_track_seqlens_cpu",
                "mamba_track_indices", "mamba_track_mask_cpu", "mamba_clear_indices",
                "mamba_cow_src_indices", "mamba_cow_dst_indices")
        return SimpleNamespace(**{k: getattr(batch, k, None) for k in keys})

    def mutant(self, batch):
        if self.witness is None or not batch.forward_mode.is_extend() or held:
            launched = real(self, batch)
            while held:
                snap, late = held.pop()
                late._radixflow_ids = self.witness.forward(snap, self._scripted)
            return launched
        launched = batch.copy() if self.cfg.overlap else batch
        held.append((snapshot(batch), launched))
        return launched

    monkeypatch.setattr(Kit, "launch", mutant)


MUTANTS = {
    "force_track_h_without_plus_one": (_no_force_track_plus_one, False),
    "publish_depth_off_by_one": (_publish_depth_off_by_one, False),
    "cow_source_freed_before_copy": (_cow_source_freed_before_the_copy, False),
    "track_slot_swapped": (_track_slot_swapped, True),
    "consumer_resumed_before_producer": (_consumer_resumed_before_its_producer, True),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_caught(name, monkeypatch):
    from radixflow_sglang.adapter.witness import WitnessMismatch

    apply, overlap = MUTANTS[name]
    cfg = KitConfig(model="qwen3.5-4b", layout="extra_buffer", overlap=overlap, tokens=1024)
    clean = run_exact("radixflow", cfg)  # NOTE: the same run without the mutant passes
    assert clean.stats["mismatched"] == 0
    apply(monkeypatch)
    with pytest.raises(WitnessMismatch, match="witness: request"):
        run_exact("radixflow", cfg)


def test_without_the_check_a_mutant_changes_outputs_silently(monkeypatch):
    """The check is what catches the mutants: with it removed, a mutant's run completes and
    only its outputs differ from the clean run's."""
    from radixflow_sglang.adapter import witness as w

    cfg = KitConfig(model="qwen3.5-4b", layout="extra_buffer", tokens=1024)
    clean = run_exact("radixflow", cfg).outputs
    _cow_source_freed_before_the_copy(monkeypatch)
    monkeypatch.setattr(w.Witness, "_mismatch", lambda self, *a, **k: None)
    silent = run_exact("radixflow", cfg)
    assert silent.stats["mismatched"] == 0
    assert any(clean[r] != silent.outputs[r] for r in clean)


def test_a_prefill_only_request_emits_nothing_whatever_its_batch(make_kit):
    """A max_new_tokens=0 request (SGLang's n > 1 warm-up) gets a dummy 0 in a prefill-only
    batch and a sampled id beside a generating request (tp_worker.py), so the id its row holds
    depends on the batch. The completion log keeps what SGLang emits (`output_ids_through_stop`):
    nothing, so the output audit compares what clients get (nsample warm, nemotron-9b seed 41:
    4 warm-ups differed from stock only in that id)."""
    from radixflow_sglang.testing.loop import CompletionLog

    prompt = list(range(1000, 1600))

    def outputs(with_generating: bool) -> tuple[dict, dict]:
        k = make_kit("qwen3.5-4b", "no_buffer", "stock")
        log = CompletionLog().install(k)
        rows = {}
        k.on_complete = lambda r: (rows.__setitem__(r.rid, tuple(r.output_ids)),
                                   log.record(r))
        k.submit(k.req("warm", prompt, max_new_tokens=0))
        if with_generating:
            k.submit(k.req("gen", list(range(5000, 5300)), max_new_tokens=3))
        k.drain()
        return log.outputs, rows

    alone, alone_rows = outputs(False)
    mixed, mixed_rows = outputs(True)
    assert alone_rows["warm"] != mixed_rows["warm"]  # NOTE: the batch-dependent id
    assert alone["warm"] == mixed["warm"] == ()
    assert len(mixed["gen"]) == 3
