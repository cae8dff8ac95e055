"""Scheduler twin (eval/twin.py), cost model, report and CLI on SGLang's real classes (CPU)."""

from __future__ import annotations

import json
import math
import time

import pytest

from eval import costmodel, report, twin
from eval.workload import Segment, arrange, offered_trace, synthetic
from radixflow_sglang import models

MODEL = "qwen3.5-4b"


def small_segments(n: int = 5, rate: float = 20.0) -> list[Segment]:
    qs = synthetic(n, profile="race", seed=3)
    return [Segment(r, "forward", tuple(offered_trace(arrange(qs, r, tag=f"t-{r}"), rate=rate,
                                                      seed=3)))
            for r in ("cold", "reuse")]


@pytest.fixture(scope="module")
def segs():
    return small_segments()


@pytest.fixture(scope="module")
def arms(segs):
    from radixflow_sglang.adapter.runtime import RadixFlowConfig

    out = {p: twin.replay(segs, MODEL, p) for p in ("stock", "radix", "traversal")}
    out["radix-off"] = twin.replay(segs, MODEL, "radix", radixflow_config=RadixFlowConfig(
        policy="radix", boundaries="off"))
    return out


def test_metrics_have_every_key(arms):
    for res in arms.values():
        assert res.ok
        missing = [k for k in twin.METRIC_KEYS if k not in res.metrics]
        assert not missing
        assert res.metrics["sender_lag_mean_s"] == 0.0
        assert len(res.round_rows) == len(res.round_tokens) == res.metrics["rounds"]


def test_same_seed_same_summary(segs, arms):
    again = twin.replay(small_segments(), MODEL, "traversal")
    base = arms["stock"]
    a = report.arm_summary(arms["traversal"], base)
    b = report.arm_summary(again, base)
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_stock_and_radix_identical(arms):
    """Our scheduler class with every RadixFlow feature off (native selection, publication
    boundaries off) is SGLang's: the same rounds and figures."""
    s, r = arms["stock"], arms["radix-off"]
    assert s.metrics == r.metrics
    assert [(x.rows, x.tokens, x.start_s, x.end_s) for x in s.rounds] == \
        [(x.rows, x.tokens, x.start_s, x.end_s) for x in r.rounds]
    # NOTE: with its default boundaries it publishes where the learner says: the cold and reuse
    # segments ask each document in different namespaces, so the document end is learned from
    # their token fork (core/boundary.py `MarkerLearner.infer`) and later branches resume there
    b = arms["radix"].metrics
    assert b["zero_hit_requests"] < s.metrics["zero_hit_requests"]
    assert b["scheduled_tokens"] < s.metrics["scheduled_tokens"]


def test_conservation_and_accounting(segs, arms):
    n_req = sum(len(q.branches) for s in segs for q in s)
    n_in = sum(len(b.input_ids) for s in segs for q in s for b in q.branches)
    for res in arms.values():
        m = res.metrics
        assert m["requests"] == n_req and m["input_tokens"] == n_in
        assert m["scheduled_tokens"] + m["hit_tokens"] == m["input_tokens"]
        assert m["scheduled_tokens"] == sum(res.round_tokens)
        assert m["reuse"] == pytest.approx(m["hit_tokens"] / m["input_tokens"])
        assert all(0 < q.latency_s < math.inf for q in res.questions)
        assert m["rounds"] >= m["l_cap"] > 0
        # rounds never overlap on the GPU and segments run one after another
        for a, b in zip(res.rounds, res.rounds[1:], strict=False):
            assert b.start_s >= a.end_s - 1e-12
        for a, b in zip(res.segments, res.segments[1:], strict=False):
            assert b.start_s >= a.end_s
        per_seg = sum(v["scheduled_tokens"] for v in m["per_segment"].values())
        assert per_seg == m["scheduled_tokens"]
    assert arms["traversal"].metrics["blocked"] > 0
    assert arms["stock"].metrics["blocked"] == arms["stock"].metrics["parked_max_rounds"] == 0


def test_double_completion_raises(monkeypatch, segs):
    from radixflow_sglang.testing import kit

    orig = kit.Kit.complete

    def complete_twice(self, batch):
        orig(self, batch)
        done = [r for r in batch.reqs if r.finished()]
        if done:
            self.on_complete(done[-1])  # the kit's completion hook fires a second time

    monkeypatch.setattr(kit.Kit, "complete", complete_twice)
    with pytest.raises(twin.ConservationError, match="completed twice"):
        twin.replay(segs[:1], MODEL, "stock")


@pytest.mark.parametrize("policy,layout,overlap", [
    ("stock", "extra_buffer", True), ("traversal", "extra_buffer", True),
    ("traversal", "no_buffer", False), ("traversal", "extra_buffer", False),
])
def test_zero_leaks_after_drain(segs, policy, layout, overlap):
    res = twin.replay(segs, MODEL, policy, layout=layout, overlap=overlap)
    m = res.metrics
    assert (m["leaked_kv_slots"], m["leaked_mamba_slots"], m["leaked_rows"]) == (0, 0, 0)


def test_full_attention_model(segs):
    res = twin.replay(segs, "qwen3-8b", "traversal")
    assert res.metrics["leaked_kv_slots"] == 0 and res.metrics["row_budget"] == 16


def test_eq2_split_is_exact(arms):
    e = twin.eq2_split(arms["traversal"].metrics, arms["stock"].metrics)
    assert e["round_credit_s"] + e["cost_shift_s"] == pytest.approx(e["latency_diff_s"])
    assert e["busy_round_credit_s"] + e["busy_cost_shift_s"] == pytest.approx(e["busy_diff_s"])


def test_capacity_bound_counts_shared_prefixes():
    qs = synthetic(3, profile="race", seed=1)
    seg = Segment("reuse", "forward", tuple(arrange(qs, "reuse")))
    bound, u = twin.capacity_bound(seg, rows=64, tokens=8192)
    total = sum(len(b.input_ids) for q in qs for b in q.branches)
    assert u < total  # the shared document and question are counted once
    assert u >= max(len(b.input_ids) for q in qs for b in q.branches)
    assert bound == max(math.ceil(u / 8192), math.ceil(12 / 64))


def test_failing_policy_is_a_failed_arm(monkeypatch, segs):
    from radixflow_sglang.testing import kit

    orig = kit.Kit.__post_init__

    def broken(self):
        if self.policy == "flex":
            raise RuntimeError("flex is not here yet")
        orig(self)

    monkeypatch.setattr(kit.Kit, "__post_init__", broken)
    res = twin.run_arm(segs, MODEL, "flex")
    assert not res.ok and "flex is not here yet" in res.error and res.metrics is None
    assert report.arm_summary(res, None) == {"failed": True, "error": res.error}


def test_cost_model_defaults_and_fit(tmp_path):
    for m in models.names():
        c = costmodel.default_cost(m)
        assert c.alpha > 0 and c.beta > 0 and c.gamma > 0 and c.delta > 0
    c4 = costmodel.default_cost(MODEL)
    assert 0.1 < c4(64, 8192) < 0.3  # a full 4B round: ~0.15 s on an H200
    truth = costmodel.CostModel(0.01, 2e-5, 3e-4)
    rows = [{"rows": r, "scheduled_tokens": t, "duration_s": truth(r, t)}
            for r, t in [(1, 100), (4, 8192), (16, 3000), (64, 8000), (8, 500)]]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    fitted = costmodel.fit(path)
    assert (fitted.alpha, fitted.beta, fitted.gamma) == pytest.approx(
        (truth.alpha, truth.beta, truth.gamma), rel=1e-6)


def test_cli_end_to_end(tmp_path):
    from eval import replay

    out = tmp_path / "tmp"
    rc = replay.main(["--workload", "synthetic", "--questions", "6", "--policies",
                      "stock,traversal", "--out", str(out),
                      "--no-progress"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["policies"] == ["stock", "traversal"]
    assert set(summary["arms"]) == {"stock", "traversal"}
    for arm in summary["arms"].values():
        assert not [k for k in twin.METRIC_KEYS if k not in arm]
    assert "eq2_split" in summary["arms"]["traversal"]
    text = (out / "report.md").read_text()
    assert "| traversal |" in text and "Eq. 2" in text
    assert (out / "latency_cdf.png").stat().st_size > 0
    assert (out / "round_fullness.png").stat().st_size > 0


def test_cli_cost_overrides_are_used_and_recorded(tmp_path):
    from eval import hostcost, replay

    out = tmp_path / "o"
    rc = replay.main(["--workload", "synthetic", "--questions", "2", "--policies", "stock",
                      "--alpha-ms", "30", "--beta-us", "20", "--gamma-ms", "0.5", "--out",
                      str(out), "--no-progress"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    cm = summary["config"]["cost_model"]
    assert (cm["alpha"], cm["beta"], cm["gamma"]) == pytest.approx((0.03, 2e-5, 5e-4))
    assert summary["arms"]["stock"]["cost_model"] == cm
    assert summary["config"]["host_cost"] == hostcost.DEFAULT_HOST.as_dict()
    # every round's GPU time is the overridden model less its host part
    fixed = hostcost.DEFAULT_HOST.fixed(costmodel.cost_with(MODEL, alpha_ms=30), 1)
    costs = summary["arms"]["stock"]["per_round"]["cost_s"]
    assert min(costs) >= 0.03 - fixed - 1e-12


def _host():
    from eval.hostcost import HostCoef, HostCost

    return HostCost(HostCoef(2e-3, 0.0, 1e-4), HostCoef(3e-3, 1e-5, 1e-4), source="test")


@pytest.mark.parametrize("overlap", [False, True])
def test_host_time_of_a_lone_round_is_not_hidden(overlap):
    cost = costmodel.CostModel(0.01, 1e-5, 1e-3)
    host = _host()
    res = twin.run_arm(one_request(), MODEL, "stock", overlap=overlap, cost=cost, host=host)
    (q,) = res.questions
    (r,) = res.rounds
    assert r.host_s == pytest.approx(2e-3 + 1e-4)
    assert r.cost_s == pytest.approx(cost(1, 1000) - host.fixed(cost, 1))  # host part moved
    assert q.latency_s == pytest.approx(cost(1, 1000))  # nothing to hide it behind
    assert res.metrics["host_s"] == pytest.approx(r.host_s)


def test_overlap_hides_host_time_behind_the_running_forward():
    """A request in 3 chunks: without overlap each chunk waits for its scan's CPU time; with
    overlap the next chunk's scan runs while the previous chunk computes."""
    cost = costmodel.CostModel(0.01, 1e-5, 1e-3)
    host = _host()
    seg = one_request(20_000)
    plain = twin.run_arm(seg, MODEL, "stock", overlap=False, cost=cost, host=host)
    ov = twin.run_arm(seg, MODEL, "stock", overlap=True, cost=cost, host=host)
    assert plain.ok and ov.ok and len(plain.rounds) == len(ov.rounds) == 3
    h = [r.host_s for r in plain.rounds]
    assert sum(r.cost_s for r in plain.rounds) == pytest.approx(sum(r.cost_s for r in ov.rounds))
    assert plain.questions[0].latency_s - ov.questions[0].latency_s == pytest.approx(h[1] + h[2])
    free = twin.run_arm(seg, MODEL, "stock", overlap=True, cost=cost)  # --host-cost none
    assert free.questions[0].latency_s == pytest.approx(3 * 0.01 + 20_000 * 1e-5 + 3e-3)


def test_under_overlap_the_next_scan_comes_after_this_scans_host_time():
    """The overlap loop's next pass runs once this pass's host work is done, while the forward
    runs: a request that registers during a scan is scanned then, and its round queues behind
    the running forward (before: the twin's next pass came at the scan's own time, saw
    nothing, and waited out the forward)."""
    from eval.workload import Branch, Question

    cost = costmodel.CostModel(0.05, 1e-5, 1e-3)  # a forward much longer than a scan
    host = _host()
    qs = []
    for i, at in enumerate((0.25, 0.2505)):  # the second comes during the first's scan
        ids = list(range(1000 + 5000 * i, 2000 + 5000 * i))
        qs.append(Question(f"q{i}", f"q{i}", (Branch(f"q{i}/A", ids, f"q{i}", 0),), 0, 0,
                           arrival_s=at))
    res = twin.run_arm([Segment("cold", "forward", tuple(qs))], MODEL, "stock", overlap=True,
                       cost=cost, host=host)
    first, second = res.rounds
    assert first.scan_s == pytest.approx(0.25)
    assert second.scan_s == pytest.approx(0.25 + first.host_s)  # the pass after the scan
    assert second.start_s == pytest.approx(first.end_s)  # its host time hid behind the forward


@pytest.mark.parametrize("argv,flag", [
    (["--model", "llama"], "--model"),
    (["--workload", "squad"], "--workload"),
    (["--policies", "stock,bogus"], "--policies"),
    (["--regime", "warm"], "--regime"),
    (["--order", "sideways"], "--order"),
    (["--rate", "-1"], "--rate"),
    (["--questions", "0"], "--questions"),
    (["--layout", "paged"], "--layout"),
    (["--alpha-ms", "-1"], "--alpha-ms"),
    (["--beta-us", "fast"], "--beta-us"),
    (["--gamma-ms", "inf"], "--gamma-ms"),
    (["--host-cost", "gpu"], "--host-cost"),
])
def test_bad_flag_values(argv, flag, capsys):
    from eval import replay

    with pytest.raises(SystemExit) as e:
        replay.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert flag in err


def one_request(n_tokens: int = 1000) -> list[Segment]:
    from eval.workload import Branch, Question

    ids = list(range(1000, 1000 + n_tokens))
    q = Question("solo", "solo", (Branch("solo/A", ids, "solo", 0),), 0, 0, arrival_s=0.25)
    return [Segment("cold", "forward", (q,))]


@pytest.mark.parametrize("overlap", [False, True])
def test_latency_is_batch_cost(overlap):
    cost = costmodel.CostModel(0.01, 1e-5, 1e-3)
    res = twin.replay(one_request(), MODEL, "stock", overlap=overlap, cost=cost)
    (q,) = res.questions
    assert q.arrival_s == 0.25
    assert q.latency_s == pytest.approx(cost(1, 1000))
    assert res.metrics["first_selection_mean_s"] == 0.0


def test_admission_hold_runs_in_virtual_time(segs, arms, monkeypatch):
    def real_sleep(seconds):
        raise AssertionError(f"the twin slept {seconds} s of wall time")

    # NOTE: the runtime binds time.sleep when built; the twin must replace it with virtual time
    monkeypatch.setattr(time, "sleep", real_sleep)
    res = twin.replay(segs, MODEL, "timer5")
    assert res.metrics["held_iterations"] > 0
    # a hold delays selection by at most the 5 ms deadline per request, in virtual time
    radix = arms["radix"].metrics["first_selection_mean_s"]
    assert radix <= res.metrics["first_selection_mean_s"] <= radix + 0.1


def test_no_buffer_overlap_traversal_completes_every_token():
    twin.replay(twin.probe_segments()[:1], MODEL, "traversal", layout="no_buffer", overlap=True)


# --- decode and closed-loop arrivals ---------------------------------------------------------


def decode_cost() -> costmodel.CostModel:
    return costmodel.CostModel(0.01, 1e-5, 1e-3, dec_alpha=4e-3, dec_gamma=1e-4, dec_kv=1e-8)


@pytest.mark.parametrize("overlap", [False, True])
def test_decode_steps_take_virtual_time(overlap):
    from eval.workload import Branch, Question

    cost = decode_cost()
    ids = list(range(1000, 2000))
    q = Question("solo", "solo", (Branch("solo/A", ids, "solo", 0, max_new_tokens=8),), 0, 0,
                 arrival_s=0.25)
    res = twin.replay([Segment("cold", "forward", (q,))], MODEL, "stock", overlap=overlap,
                      cost=cost)
    m = res.metrics
    steps = [cost.decode(1, 1000 + i) for i in range(1, 8)]  # 7 steps after the prefill
    assert m["rounds"] == 1 and m["decode_steps"] == 7 and m["output_tokens"] == 8
    assert [r.cached_tokens for r in res.decode_rounds] == list(range(1001, 1008))
    assert m["decode_s"] == pytest.approx(sum(steps))
    assert m["ttft_mean_s"] == pytest.approx(cost(1, 1000))
    assert res.questions[0].latency_s == pytest.approx(cost(1, 1000) + sum(steps))
    assert m["scheduled_tokens"] + m["hit_tokens"] == m["input_tokens"] == 1000


def test_default_cost_has_a_decode_term():
    c = costmodel.default_cost(MODEL)
    assert 0 < c.dec_alpha < c.alpha and c.dec_gamma > 0 and c.dec_kv > 0
    assert c.decode(64, 128_000) > c.decode(1, 1000) > c.dec_alpha
    assert costmodel.cost_with(MODEL, alpha_ms=3).dec_alpha == c.dec_alpha


def turns(gap: float = 0.05) -> list[Segment]:
    """Turn 2 extends turn 1's prompt and scripted answer; it is sent `gap` s after turn 1."""
    from eval.workload import Branch, Question

    prompt, answer = list(range(2000, 2500)), tuple(range(60_000, 60_040))
    t1 = Question("t1", "c", (Branch("c/1", prompt, "c", 0, max_new_tokens=40, output=answer),),
                  0, 0, arrival_s=0.1)
    noise = Question("n", "n", (Branch("n/1", list(range(9000, 9300)), "n", 0),), 0, 0,
                     arrival_s=0.11)
    t2 = Question("t2", "c", (Branch("c/2", prompt + list(answer) + list(range(70_000, 70_030)),
                                     "c", 0, max_new_tokens=4),), 0, 0, arrival_s=gap, after="t1")
    return [Segment("multiturn", "forward", (t1, noise, t2))]


@pytest.mark.parametrize("overlap", [False, True])
def test_a_question_with_after_arrives_when_the_other_completed(overlap):
    res = twin.replay(turns(), MODEL, "radixflow", overlap=overlap, cost=decode_cost())
    q1, _, q2 = res.questions
    assert q2.arrival_s == pytest.approx(q1.completion_s + 0.05)
    assert q2.completion_s > q2.arrival_s
    last = res.rounds[-1]
    assert last.scan_s >= q2.arrival_s  # its prefill was scanned after it arrived
    # the second turn hits the first turn's prompt and (part of) its answer
    assert last.hit_tokens > 500
    assert res.metrics["request_latency_mean_s"] == pytest.approx(
        sum(q.latency_s for q in res.questions) / 3)


def test_zero_hit_counts_split_followers_from_open_loop_requests():
    """t1 and the noise start cold; the follower t2 hits t1's prompt (issue 15's count)."""
    m = twin.replay(turns(), MODEL, "stock", cost=decode_cost()).metrics
    assert (m["zero_hit_requests"], m["zero_hit_after_requests"], m["after_requests"]) == (2, 0, 1)


def test_after_must_name_an_earlier_question():
    seg = turns()[0]
    bad = Segment("multiturn", "forward", (seg.questions[2], *seg.questions[:2]))
    with pytest.raises(ValueError, match=r"question 't2': after='t1' is not an earlier"):
        twin.replay([bad], MODEL, "stock", cost=decode_cost())


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("policy", ["stock", "radixflow"])
def test_one_token_twin_is_the_twin_before_decode(monkeypatch, overlap, policy):
    """The paper's one-token workload: the twin over the kit's pre-decode step (no running
    batch; radixflow_sglang/testing/fixtures.py `old_step`) gives the same rounds and
    latencies."""
    from radixflow_sglang.testing.fixtures import old_step
    from radixflow_sglang.testing.kit import Kit

    segs = twin.probe_segments(seed=2)
    new = twin.replay(segs, MODEL, policy, overlap=overlap)
    monkeypatch.setattr(Kit, "step", old_step)
    old = twin.replay(segs, MODEL, policy, overlap=overlap)
    assert new.decode_rounds == [] and new.metrics["decode_steps"] == 0
    assert [(r.rows, r.tokens, r.hit_tokens, r.start_s, r.end_s) for r in new.rounds] == \
        [(r.rows, r.tokens, r.hit_tokens, r.start_s, r.end_s) for r in old.rounds]
    assert new.latencies == old.latencies


def test_retraction_re_prefills_and_is_counted():
    """A tiny KV pool and requests without ignore_eos: SGLang's retract_decode sends a
    request back; it re-prefills its input and generated ids, counted as reprefill_tokens."""
    from eval.workload import Branch, Question

    qs = []
    for i, n in enumerate([600] * 3 + [10] * 8 + [600] * 3):
        ids = list(range(1000 * (i + 1), 1000 * (i + 1) + 100))
        qs.append(Question(f"q{i}", f"q{i}", (Branch(f"q{i}/A", ids, f"q{i}", 0,
                                                     max_new_tokens=n),), 0, 0))
    res = twin.replay([Segment("cold", "forward", tuple(qs))], MODEL, "radixflow",
                      cost=decode_cost(), kit_overrides={"kv_tokens": 3000, "rows": 16},
                      ignore_eos=False)
    m = res.metrics
    assert m["retractions"] >= 1 and m["reprefill_tokens"] > 100
    assert m["scheduled_tokens"] - m["reprefill_tokens"] + m["hit_tokens"] == m["input_tokens"]
    assert m["leaked_kv_slots"] == 0 and m["leaked_mamba_slots"] == 0
    assert len(res.questions) == 14 and all(q.completion_s > 0 for q in res.questions)


def test_a_decode_step_costs_the_same_host_time_under_every_policy():
    """The host model charges decode steps their own scan's coefficients in every arm (the
    traversal fit's negative intercept once made radixflow's decode steps free while stock
    paid 1.5 ms), per running row, below a prefill scan's fixed time."""
    from eval.hostcost import DEFAULT_HOST

    hosts = {}
    for policy in ("stock", "radixflow"):
        res = twin.run_arm(turns(), MODEL, policy, cost=decode_cost(), host=DEFAULT_HOST)
        assert res.ok, res.error
        hosts[policy] = [(r.host_s, r.rows) for r in res.decode_rounds]
        assert hosts[policy] and min(h for h, _ in hosts[policy]) > 0
    assert [r for _, r in hosts["radixflow"]] == [r for _, r in hosts["stock"]]
    assert [h for h, _ in hosts["radixflow"]] == pytest.approx([h for h, _ in hosts["stock"]])
    for h, rows in hosts["stock"]:
        assert h == pytest.approx(DEFAULT_HOST.decode(0, rows), abs=1e-9)
        assert h < DEFAULT_HOST.native.s0
