"""Traffic workloads (eval/traffic.py), their replay CLI (eval/replay.py) and the live client's
closed loop, multi-turn continuation and `n` sampling (eval/client.py), the last against a real
simulated SGLang server."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from eval import client, replay, traffic
from eval import workload as wl
from eval.twin import lcp

ROOT = Path(__file__).resolve().parents[1]
MODEL = "qwen3.5-4b"


def seg_of(name: str, seed: int = 0, rate: float | None = None, **shape) -> wl.Segment:
    segs = traffic.segments(name, MODEL, seed=seed, rate=rate, **shape)
    assert len(segs) == 1
    return segs[0]


def ids_of(seg: wl.Segment) -> list[list[int]]:
    return [b.input_ids for q in seg for b in q.branches]


# --- generators ---------------------------------------------------------------------------


def test_gsp_burst_is_bench_servings_shape_with_exact_lengths_and_boundaries():
    seg = seg_of("gsp")
    assert seg.name == "gsp-burst" and len(seg) == 16 * 4
    groups: dict[str, list[list[int]]] = {}
    for q in seg:
        (b,) = q.branches  # each request its own question (the latency unit)
        assert len(b.input_ids) == 2048 + 64
        assert b.max_new_tokens == 4 and b.boundary == 2048 and b.output == ()
        assert q.arrival_s == 0.0 and q.after is None
        assert all(lo <= t < hi for t in b.input_ids for lo, hi in [wl.SYNTHETIC_ID_RANGE])
        groups.setdefault(q.doc_id, []).append(b.input_ids)
    assert len(groups) == 16 and all(len(v) == 4 for v in groups.values())
    for members in groups.values():  # a group shares exactly its system prompt
        assert {tuple(m[:2048]) for m in members} == {tuple(members[0][:2048])}
        assert all(lcp(members[0], m) < 2048 + 8 for m in members[1:])
    firsts = [v[0] for v in groups.values()]
    assert max(lcp(a, b) for a in firsts for b in firsts if a is not b) < 8
    # shuffled as bench_serving does without --gsp-ordered: not group by group
    docs = [q.doc_id for q in seg]
    assert docs != sorted(docs, key=lambda d: int(d[1:]))
    assert len({b.rid for q in seg for b in q.branches}) == 64


def test_gsp_rate_spreads_arrivals_without_changing_prompts():
    burst, paced = seg_of("gsp", seed=3), seg_of("gsp", seed=3, rate=16.0)
    assert sorted(map(tuple, ids_of(burst))) == sorted(map(tuple, ids_of(paced)))
    times = [q.arrival_s for q in paced]
    assert times[0] == 0.0 and times == sorted(times) and times[-1] > 0
    assert paced.name == "gsp-poisson"


def test_seeds_draw_different_prompts_and_a_seed_repeats():
    for name in traffic.WORKLOADS:
        a, b, again = seg_of(name, seed=1), seg_of(name, seed=2), seg_of(name, seed=1)
        assert ids_of(a) == ids_of(again), name
        assert not set(map(tuple, ids_of(a))) & set(map(tuple, ids_of(b))), name


def test_gsp_paced_siblings_are_after_their_groups_first_request():
    seg, burst = seg_of("gsp-paced", groups=5, prompts_per_group=3), seg_of(
        "gsp", groups=5, prompts_per_group=3)
    assert seg.name == "gsp-paced"
    client.check_after(seg)  # every after names an earlier question
    firsts = {q.doc_id: q for q in seg if q.after is None}
    assert len(firsts) == 5 and all(q.qid.endswith(".p0") for q in firsts.values())
    sibs = [q for q in seg if q.after is not None]
    assert len(sibs) == 10
    for q in sibs:
        assert q.after == firsts[q.doc_id].qid and q.arrival_s == 0.0
        assert q.branches[0].input_ids[:2048] == firsts[q.doc_id].branches[0].input_ids[:2048]
    assert sorted(map(tuple, ids_of(seg))) == sorted(map(tuple, ids_of(burst)))  # same prompts


def test_nsample_burst_and_warm():
    burst = seg_of("nsample", prompts=3)
    assert burst.name == "nsample-burst" and len(burst) == 3
    for q in burst:
        assert len(q.branches) == 8 and q.after is None
        assert all(b.input_ids == q.branches[0].input_ids for b in q.branches)
        assert {len(b.input_ids) for b in q.branches} == {1024}
        assert {b.max_new_tokens for b in q.branches} == {128}
    assert len({b.rid for q in burst for b in q.branches}) == 24
    warm = seg_of("nsample", prompts=3, nsample_mode="warm", n=4, prompt_len=256, output_len=64)
    assert warm.name == "nsample-warm" and len(warm) == 6
    client.check_after(warm)
    for w, s in zip(warm.questions[::2], warm.questions[1::2], strict=True):
        (wb,) = w.branches
        assert wb.max_new_tokens == 0 and w.after is None and len(wb.input_ids) == 256
        assert s.after == w.qid and s.arrival_s == 0.0 and len(s.branches) == 4
        assert all(b.input_ids == wb.input_ids and b.max_new_tokens == 64 for b in s.branches)
    # the two modes draw the same prompts for a seed
    assert [q.branches[0].input_ids for q in seg_of("nsample", prompts=3, prompt_len=256)] == [
        q.branches[0].input_ids for q in warm.questions[1::2]]


def test_multiturn_turns_extend_prompt_and_scripted_output():
    seg = seg_of("multiturn", conversations=3, turns=3, prompt_len=100, user_len=10,
                 output_len=5, think_s=2.0)
    client.check_after(seg)
    assert len(seg) == 9 and seg.name == "multiturn-closed"
    # interleaved: every first turn, then every second turn, ...
    assert [q.qid.split(".")[1] for q in seg] == ["t0"] * 3 + ["t1"] * 3 + ["t2"] * 3
    by = {q.qid: q for q in seg}
    gaps = []
    for c in range(3):
        for k in range(3):
            q = by[f"c{c}.t{k}"]
            (b,) = q.branches
            assert len(b.output) == b.max_new_tokens == 5
            assert len(b.input_ids) == 100 + k * (5 + 10)
            if k == 0:
                assert q.after is None and q.prefix_len == 0
                continue
            prev = by[f"c{c}.t{k - 1}"].branches[0]
            assert q.after == f"c{c}.t{k - 1}"
            assert b.input_ids[:len(prev.input_ids) + 5] == prev.input_ids + list(prev.output)
            assert q.prefix_len == len(prev.input_ids) + 5
            gaps.append(q.arrival_s)
    assert all(g > 0 for g in gaps) and len(set(gaps)) == len(gaps)  # exponential think gaps
    zero = seg_of("multiturn", conversations=2, turns=2, think_s=0.0)
    assert [q.arrival_s for q in zero if q.after] == [0.0, 0.0]


def test_noshare_prompts_share_nothing():
    seg = seg_of("noshare", prompts=20)
    prompts = ids_of(seg)
    assert {len(p) for p in prompts} == {2112} and len(seg) == 20
    assert max(lcp(a, b) for a in prompts for b in prompts if a is not b) < 8
    times = [q.arrival_s for q in seg]
    assert times[0] == 0.0 and times == sorted(times) and len(set(times)) == 20
    assert all(q.branches[0].boundary is None and q.branches[0].max_new_tokens == 4 for q in seg)


def test_workload_dispatches_traffic_names_and_rejects_paper_settings():
    assert ids_of(wl.workload("gsp", MODEL, seed=4, groups=2)[0]) == ids_of(
        seg_of("gsp", seed=4, groups=2))
    assert seg_of("gsp", groups=None, output_len=None) == seg_of("gsp")  # None: the default
    with pytest.raises(ValueError, match="regime applies to the paper workloads"):
        wl.workload("gsp", MODEL, regime="cold")
    with pytest.raises(ValueError, match="questions applies to the paper workloads"):
        wl.workload("noshare", MODEL, questions=5)
    with pytest.raises(ValueError, match="groups: shape settings of the traffic workloads"):
        wl.workload("synthetic", MODEL, questions=4, groups=3)


@pytest.mark.parametrize(("name", "shape", "message"), [
    ("gsp", {"n": 4}, "--n does not apply to --workload gsp"),
    ("nsample", {"nsample_mode": "both"}, "--nsample-mode must be one of burst, warm"),
    ("gsp", {"groups": 0}, "--groups must be a number >= 1"),
    ("multiturn", {"turns": 2.5}, "--turns must be an integer >= 1"),
    ("multiturn", {"think_s": -1.0}, "--think-s must be a number >= 0"),
    ("noshare", {"prompt_len": 40_000}, "over the context length 32768; lower --prompt-len"),
    ("chat", {}, "unknown traffic workload 'chat'"),
])
def test_shape_errors_name_the_flag(name, shape, message):
    with pytest.raises(ValueError, match=message):
        traffic.segments(name, MODEL, **shape)


def test_rate_and_model_are_checked():
    with pytest.raises(ValueError, match="rate must be > 0"):
        traffic.segments("noshare", MODEL, rate=0.0)
    with pytest.raises(ValueError, match="unknown model 'gpt-9'"):
        traffic.segments("noshare", "gpt-9")


# --- CLI -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "message"), [
    (["--workload", "gsp", "--regime", "cold"],
     "--regime applies to the paper workloads (race, quality, mix, synthetic) only"),
    (["--workload", "nsample", "--questions", "5"], "--questions applies to the paper"),
    (["--workload", "gsp", "--n", "4"], "--n does not apply to --workload gsp (its flags: "
     "--groups, --prompts-per-group"),
    (["--workload", "mix", "--groups", "2"], "--groups applies to --workload gsp, gsp-paced, "
     "sibling-after-completion only, not to mix"),
    (["--workload", "nsample", "--nsample-mode", "x"], "argument --nsample-mode: invalid choice"),
    (["--workload", "gsp", "--system-len", "0"], "argument --system-len: must be > 0"),
    (["--workload", "gsp", "--system-len", "40000"], "over the context length"),
    (["--workload", "chat"], "argument --workload: invalid choice"),
])
def test_cli_errors_name_the_flag(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        replay.main([*argv, "--out", str(tmp_path / "x")])
    assert e.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_cli_replays_a_traffic_workload_and_records_its_shape(tmp_path):
    out = tmp_path / "gsp"
    rc = replay.main(["--workload", "gsp-paced", "--groups", "2", "--prompts-per-group", "2",
                      "--system-len", "128", "--question-len", "16", "--policies",
                      "stock,radixflow", "--out", str(out), "--no-progress", "--seed", "5"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    cfg = summary["config"]
    assert cfg["shape"] == {"workload": "gsp-paced", "seed": 5, "rate": "inf", "groups": 2,
                            "prompts_per_group": 2, "system_len": 128, "question_len": 16,
                            "output_len": 4}
    assert cfg["rate"] == "inf" and cfg["regime"] is None and cfg["questions"] is None
    for arm in ("stock", "radixflow"):
        m = summary["arms"][arm]
        assert m["requests"] == 4 and m["input_tokens"] == 4 * 144, arm
        assert m["scheduled_tokens"] + m["hit_tokens"] == m["input_tokens"]


# --- the live client without a server (its own scheduling logic) --------------------------


class EchoSender:
    """A client.Sender answering at once: output ids = the scripted ones + 1 (so a live output
    differs from the script), in-process; records what it was sent."""

    def __init__(self, fail: set[str] = frozenset()) -> None:
        self.sent: dict[str, list[int]] = {}
        self.fail = fail

    def send(self, q: wl.Question, slot: client.Slot) -> list[client.BranchRecord]:
        recs = []
        for b in q.branches:
            r = client.BranchRecord.open(q, b, slot)
            r.send_s = slot.q_send_s
            self.sent[b.rid] = list(b.input_ids)
            if q.qid in self.fail:
                r.error = "RuntimeError: HTTP 500"
            else:
                r.fill({"output_ids": [t + 1 for t in b.output] or [7] * b.max_new_tokens,
                        "meta_info": {"prompt_tokens": len(b.input_ids), "cached_tokens": 0}})
            r.done_s = slot.q_send_s
            recs.append(r)
        return recs

    def close(self) -> None:
        pass


def test_replay_closed_loop_sends_the_next_turn_with_the_actual_output():
    seg = seg_of("multiturn", conversations=2, turns=3, prompt_len=30, user_len=4,
                 output_len=3, think_s=0.0)
    sender = EchoSender()
    res = client.replay([seg], sender, pool=4, progress=False)
    recs = {r.qid: r for r in res.records}
    assert len(recs) == 6 and not client.failed([asdict(r)
                                                  for r in res.records])
    by = {q.qid: q for q in seg}
    for c in range(2):
        for k in (1, 2):
            q, prev = by[f"c{c}.t{k}"], recs[f"c{c}.t{k - 1}"]
            sent, prev_sent = sender.sent[q.branches[0].rid], sender.sent[prev.rid]
            user = q.branches[0].input_ids[-4:]
            assert sent == prev_sent + prev.output_ids + user  # the actual output, not the script
            assert prev.output_ids != list(by[prev.qid].branches[0].output)
            assert recs[q.qid].q_send_s >= prev.done_s  # sent only once the turn before finished
            assert recs[q.qid].after == prev.qid and recs[q.qid].input_len == len(sent)


def test_replay_fails_the_dependents_of_a_failed_question_without_sending_them():
    seg = seg_of("gsp-paced", groups=2, prompts_per_group=3, system_len=16, question_len=4)
    sender = EchoSender(fail={"g0.p0"})
    res = client.replay([seg], sender, pool=2, progress=False)
    bad = {r.qid: r.error for r in res.records if r.error}
    assert set(bad) == {"g0.p0", "g0.p1", "g0.p2"}
    assert "not sent: g0.p0 failed" in bad["g0.p1"]
    assert {rid.split("/")[-2] for rid in sender.sent} == {"g0.p0", "g1.p0", "g1.p1", "g1.p2"}


def test_summary_counts_zero_hit_requests_and_output_tokens():
    seg = seg_of("gsp-paced", groups=2, prompts_per_group=3, system_len=16, question_len=4)
    res = client.replay([seg], EchoSender(), pool=2, progress=False)
    rows = [asdict(r) for r in res.records]
    for r in rows:  # siblings of g0 reuse its system prompt, g1's reuse nothing
        r["cached_tokens"] = 16 if r["after"] == "g0.p0" else 0
    m = client.summarize(rows, None)
    assert m["zero_hit_requests"] == 4 and m["zero_hit_after_requests"] == 2
    assert m["output_tokens"] == 6 * 4 and m["hit_tokens"] == 32


def test_check_after_rejects_a_forward_reference():
    seg = seg_of("gsp-paced", groups=1, prompts_per_group=2, system_len=8, question_len=2)
    backwards = wl.Segment(seg.regime, seg.order, tuple(reversed(seg.questions)))
    with pytest.raises(ValueError, match="is after 'g0.p0', which is not an earlier question"):
        client.check_after(backwards)


def test_fold_warm_and_the_n_request_body():
    warm = seg_of("nsample", prompts=2, nsample_mode="warm", n=3, prompt_len=10, output_len=2,
                  rate=2.0)
    (folded,) = client.fold_warm([warm])
    assert [q.qid for q in folded] == ["p0", "p1"]
    assert [q.arrival_s for q in folded] == [q.arrival_s for q in warm.questions[::2]]
    assert all(q.after is None and client.identical_branches(q) for q in folded)
    burst = seg_of("nsample", prompts=2, n=3, prompt_len=10, output_len=2)
    assert client.fold_warm([burst])[0] == burst  # nothing to fold
    multi = seg_of("multiturn", conversations=1, turns=2, prompt_len=10)
    assert client.fold_warm([multi])[0] == multi  # a continuation is not a warm request
    s = client.GenerateSender("http://x", pool=1, namespace_prefix="arm/", n_param=True)
    try:
        body = s.n_body(folded.questions[0])
        one = s.body(warm.questions[0].branches[0])
    finally:
        s.close()
    assert body["sampling_params"] == {"max_new_tokens": 2, "temperature": 0,
                                       "ignore_eos": True, "n": 3}
    assert "rid" not in body and body["extra_key"] == "arm/nsample/s0"
    assert one["sampling_params"]["max_new_tokens"] == 0  # the warm request, when sent itself


# --- the live client against a real simulated server ----------------------------------------


class RecordingSender(client.GenerateSender):
    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.bodies: list[dict] = []

    def body(self, b):
        out = super().body(b)
        self.bodies.append(out)
        return out


@pytest.mark.slow  # one server start (about a minute on 2 busy cores)
def test_live_client_multiturn_and_n_sampling_on_a_real_server(tmp_path):
    from radixflow_sglang.testing.server import Server, free_port

    model = ROOT / "radixflow_sglang" / "model_dirs" / "qwen3.5-0.8b"
    if not (model / "tokenizer.json").exists():
        subprocess.run([sys.executable, "-m", "radixflow_sglang.tokenizer", "--ensure",
                        str(model)], cwd=ROOT, check=True, timeout=300)
    port = free_port()
    trace = tmp_path / "trace.jsonl"
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1",
               RADIXFLOW_POLICY="radixflow", RADIXFLOW_TRACE=str(trace))
    cmd = [sys.executable, "-m", "radixflow_sglang.adapter.simulated", "--model-path",
           str(model), "--load-format", "dummy", "--device", "cpu", "--context-length", "8192",
           "--host", "127.0.0.1", "--port", str(port), "--disable-overlap-schedule",
           "--mamba-radix-cache-strategy", "extra_buffer", "--max-running-requests", "16",
           "--chunked-prefill-size", "8192", "--max-prefill-tokens", "8192", "--sleep-on-idle"]
    multi = seg_of("multiturn", conversations=2, turns=2, prompt_len=150, user_len=12,
                   output_len=3, think_s=0.0, rate=math.inf)
    warm = client.fold_warm([seg_of("nsample", prompts=1, nsample_mode="warm", n=3,
                                    prompt_len=140, output_len=2)])
    with Server(cmd, env, tmp_path / "server.log", port, cwd=ROOT) as srv:
        srv.wait_ready(600)
        turns = RecordingSender(srv.base, pool=4, namespace_prefix="live/")
        try:
            res = client.replay([multi], turns, pool=4, progress=False)
        finally:
            turns.close()
        sampler = RecordingSender(srv.base, pool=2, namespace_prefix="live/", n_param=True)
        try:
            n_res = client.replay(warm, sampler, pool=2, progress=False)
        finally:
            sampler.close()
        leaks = srv.idle_leak_check()
    rows = [asdict(r) for r in res.records]
    assert not client.failed(rows), client.failed(rows)
    recs = {r.qid: r for r in res.records}
    sent = {b["rid"]: b["input_ids"] for b in turns.bodies}
    for c in range(2):
        first, second = recs[f"c{c}.t0"], recs[f"c{c}.t1"]
        assert len(first.output_ids) == 3 and first.prompt_tokens == 150
        user = multi.questions[2 + c].branches[0].input_ids[-12:]
        assert sent[second.rid] == sent[first.rid] + first.output_ids + user
        assert second.prompt_tokens == 150 + 3 + 12 and second.q_send_s >= first.done_s
    assert {b["sampling_params"]["max_new_tokens"] for b in turns.bodies} == {3}
    m = client.summarize(rows, client.load_trace(trace), leaks=leaks)
    assert m["requests"] == 4 and m["questions"] == 4 and m["rounds"] > 0
    # n sampling: one request with n=3 (SGLang sends its own warm request), three samples back
    assert len(sampler.bodies) == 1 and sampler.bodies[0]["sampling_params"]["n"] == 3
    n_rows = [asdict(r) for r in n_res.records]
    assert not client.failed(n_rows) and len(n_rows) == 3
    assert all(len(r["output_ids"]) == 2 and r["prompt_tokens"] == 140 for r in n_rows)
    assert len({r["server_rid"] for r in n_rows}) == 3
    assert leaks == {"kv": 0, "mamba": 0}
