"""SGLang's `--enable-mixed-chunk` on the CPU kit (`KitConfig.mixed_chunk`).

scheduler.py `get_new_batch_prefill`: a prefill that forms while requests decode takes their
decode rows along (schedule_batch.py `mix_with_running`: ForwardMode.MIXED, each row a
one-token extend at seq_len - 1, the batch's `decoding_reqs`). The kit records them apart
(`Round.decoding`): the harness counts them as decode steps of running requests, never as
prefill chunks; chunk chains and coverage read the prefill rows only, and the row and token
budgets count both (SGLang's PrefillAdder is given the running rows as
`num_mixed_decode_tokens`). Deterministic: no sleeps, no wall clock.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from eval import exactness, soak
from radixflow_sglang.testing.harness import Harness, Violations
from radixflow_sglang.testing.kit import Round

POLICIES = ["stock", "radixflow"]
NO_LEAK = {"kv": 0, "rows": 0, "mamba": 0}
TOKENS = 256  # chunked_prefill_size: B's 600-token prompt takes three rounds
A_PROMPT, B_PROMPT = 300, 600


def toks(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def a_decodes_then_b(make_kit, policy: str, overlap: bool, mixed: bool):
    """A (12 output ids) prefills and decodes one step; then B arrives. Returns the kit, its
    harness and B's first round (with mixed chunk: A's decode row rides in it)."""
    k = make_kit("qwen3.5-4b", "extra_buffer", policy, overlap=overlap, tokens=TOKENS,
                 mixed_chunk=mixed)
    h = Harness(k)
    h.submit("a", toks(100, A_PROMPT), max_new_tokens=12)
    steps = [h.step() for _ in range(3)]
    assert [r.mode for r in steps] == ["prefill", "prefill", "decode"]  # 256 + 44, a step
    h.submit("b", toks(5000, B_PROMPT), max_new_tokens=4)
    first = h.step()
    return k, h, first


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_decode_row_rides_in_a_prefill_and_outputs_do_not_change(make_kit, policy, overlap):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    runs = {}
    for mixed in (False, True):
        k, h, first = a_decodes_then_b(make_kit, policy, overlap, mixed)
        assert k.sched.is_mixed_chunk is mixed
        assert k.pools.server_args.enable_mixed_chunk is mixed
        batch = k.sched.last_batch  # the batch `first` was launched from
        assert first.mode == "prefill" and first.rids == ["b"] and first.prefix == {"b": 0}
        if mixed:
            # A's third output position: its prefill sampled one id, a decode step another
            seq = A_PROMPT + 2
            assert first.decoding == {"a": seq} and first.mixed
            # the adder budgets the decode row: rem_chunk_tokens = TOKENS - 1
            assert first.extend == {"b": TOKENS - 1}
            assert batch.forward_mode == ForwardMode.MIXED
            assert [r.rid for r in batch.reqs] == ["b", "a"]
            assert [r.rid for r in batch.decoding_reqs] == ["a"]
            assert list(batch.prefix_lens) == [0, seq - 1]
            assert list(batch.extend_lens) == [TOKENS - 1, 1]
        else:
            assert first.decoding == {} and not first.mixed and first.extend == {"b": TOKENS}
            assert batch.forward_mode == ForwardMode.EXTEND and not batch.decoding_reqs
        h.drain()
        leaks = h.finish()
        assert not h.violations, h.violations.examples
        assert leaks == NO_LEAK
        assert k.witness.stats.mismatched == 0 and k.witness.stats.requests == 2
        b_rounds = [r for r in k.rounds if "b" in r.rids]
        assert sum(r.extend["b"] for r in b_rounds) == B_PROMPT  # its chunks chain, decode aside
        # with mixed chunk every chunk of B carried A's decode row; without, none did
        assert h.mixed_rounds == h.mixed_decode_rows == (len(b_rounds) if mixed else 0)
        assert all(r.decoding == ({"a": r.decoding.get("a")} if mixed else {})
                   for r in b_rounds)
        runs[mixed] = h.completions.outputs
    assert len(runs[True]["a"]) == 12 and len(runs[True]["b"]) == 4
    assert runs[True] == runs[False]  # the witness's ids are functions of the states


@pytest.mark.parametrize("layout, overlap", [("extra_buffer", True), ("extra_buffer", False),
                                             ("no_buffer", False)])
@pytest.mark.parametrize("policy", POLICIES)
def test_a_mixed_chunk_soak_is_clean(policy, layout, overlap):
    n = 400
    arrivals = soak.soak_workload(n, rate=150.0, seed=5)
    cfg = soak.SoakConfig(layout=layout, overlap=overlap, max_new_tokens=16, mixed_chunk=True,
                          seed=5)
    res = soak.run_policy(policy, arrivals, cfg)
    assert res["violations"] == 0, res["violation_examples"]
    assert res["completed"] + res["aborted"] == n
    assert res["witness_mismatched"] == 0 and res["witness_verified"] == res["completed"]
    assert (res["leaked_kv_slots"], res["leaked_mamba_slots"], res["leaked_rows"]) == (0, 0, 0)
    # mixing happened (the test fails if it silently stops): decode rows rode in prefills
    assert res["mixed_rounds"] > 0 and res["mixed_decode_rows"] >= res["mixed_rounds"]
    if overlap:
        assert res["retracted"] > 0


def test_a_broken_chunk_chain_in_a_mixed_run_is_caught(make_kit):
    """The same run, its record of B's second chunk shifted one token (it claims to resume at
    256, not 255): the chunk chain breaks, once, and nothing else."""
    k, h, first = a_decodes_then_b(make_kit, "stock", False, True)
    real = k._record

    def shifted(batch):
        rnd = real(batch)
        if "b" in rnd.rids and rnd.prefix["b"] > 0 and rnd.mixed:
            rnd.prefix["b"] += 1
            rnd.extend["b"] -= 1
            k._record = real  # once
        return rnd

    k._record = shifted
    h.drain()
    h.finish()
    assert h.violations.count == Counter({"chunk_chain": 1}), h.violations.examples
    assert h.mixed_rounds == 3


def _bad(first: Round, kind: str) -> Round:
    """A fabricated record of the round after `first` (B's second chunk, A's decode row)."""
    b_end = first.prefix["b"] + first.extend["b"]
    seq = first.decoding["a"] + 1
    ext = 100  # within the budget with the decode rows
    if kind == "chunk_chain":  # B resumes past where its first chunk ended
        return Round(first.index + 1, ["b"], {"b": ext}, {"b": b_end + 1}, {"b": None}, "b",
                     decoding={"a": seq})
    if kind == "decode_row_as_chunk":
        # what a record blind to mixing read: A's row from its last prefill's prefix_len (256)
        return Round(first.index + 1, ["b", "a"], {"b": TOKENS - 1, "a": seq - TOKENS},
                     {"b": b_end, "a": TOKENS}, {"b": None, "a": None}, "b")
    if kind == "token_budget":  # a whole budget of prefill plus the decode row
        return Round(first.index + 1, ["b"], {"b": TOKENS}, {"b": b_end}, {"b": None}, "b",
                     decoding={"a": seq})
    if kind == "mixed_not_running":  # a decode row of a request that was not running
        return Round(first.index + 1, ["b"], {"b": ext}, {"b": b_end}, {"b": None}, "b",
                     decoding={"a": seq, "c": 10})
    if kind == "duplicate_row":  # A both a prefill row and a decode row
        return Round(first.index + 1, ["b", "a"], {"b": ext, "a": 1}, {"b": b_end, "a": seq - 1},
                     {"b": None, "a": None}, "b", decoding={"a": seq})
    raise ValueError(kind)


@pytest.mark.parametrize("kind, expected", [
    ("chunk_chain", {"chunk_chain": 1}),
    # the previous session's reading: A's row breaks its chain and spends B's token budget
    ("decode_row_as_chunk", {"chunk_chain": 1, "token_budget": 1}),
    ("token_budget", {"token_budget": 1}),
    # c queued, never prefilled: not running, and its prompt is not computed
    ("mixed_not_running", {"mixed_not_running": 1, "decode_before_prefill": 1}),
    ("duplicate_row", {"duplicate_row": 1, "chunk_chain": 1}),
])
def test_the_checks_fail_on_a_bad_mixed_record(make_kit, kind, expected):
    """Fed to the harness's round check after B's first mixed round: the good record passes,
    each bad one breaks exactly the invariants named."""
    k, h, first = a_decodes_then_b(make_kit, "stock", False, True)
    assert not h.violations and first.decoding
    h.submit("c", toks(90_000, 10))
    h.violations = Violations()
    h._check_round(_bad(first, kind))
    assert dict(h.violations.count) == expected, h.violations.examples


def test_the_good_mixed_record_passes_the_same_check(make_kit):
    k, h, first = a_decodes_then_b(make_kit, "stock", False, True)
    good = _bad(first, "chunk_chain")
    good.prefix["b"] -= 1  # resumes where its first chunk ended
    h._check_round(good)
    assert not h.violations, h.violations.examples


def test_soak_and_exactness_clis_take_and_record_mixed_chunk(tmp_path: Path):
    rc = soak.main(["--requests", "60", "--out", str(tmp_path / "soak"), "--policies",
                    "stock", "--max-new-tokens", "8", "--mixed-chunk", "--no-progress"])
    doc = json.loads((tmp_path / "soak" / "soak.json").read_text())
    assert rc == 0 and doc["config"]["mixed_chunk"] is True
    assert doc["policies"]["stock"]["mixed_rounds"] > 0
    rc = exactness.main(["--requests", "60", "--out", str(tmp_path / "ex"), "--policies",
                         "stock", "--configs", "gdn-extra", "--mixed-chunk"])
    doc = json.loads((tmp_path / "ex" / "exactness.json").read_text())
    assert rc == 0 and doc["mixed_chunk"] is True
    assert doc["runs"][0]["mixed_rounds"] > 0 and doc["runs"][0]["violations"] == 0
