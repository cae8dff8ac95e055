"""The `replay` twin (eval/livetwin.py): what it reads off a live run's files (registration
stamps, the stock runs' inter-token latency) and how it replays them (arrivals in send order,
a burst's latency from the send, h per loop iteration)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from eval import livetwin, run_arms
from eval.hostcost import host_model
from eval.requests import undeclared
from eval.workload import workload

MODEL = "qwen3.5-0.8b"


def _gsp(n_groups: int = 2, per: int = 2):
    return undeclared(workload("gsp", MODEL, groups=n_groups, prompts_per_group=per,
                               system_len=512, question_len=16, output_len=3))


def _trace(path, stamps):
    rows = [{"event": "round", "round": 1}]
    rows += [{"event": "selected", "rid": f"r{i}", "registered": t} for i, t in enumerate(stamps)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_registrations_drop_the_warm_up_and_sort(tmp_path):
    # NOTE: selected in scan order, not registration order; the warm-up 15 s earlier
    trace = _trace(tmp_path / "trace.jsonl", [100.0, 115.03, 115.09, 115.05, 115.2])
    got = livetwin.registrations(trace, 4)
    assert got == pytest.approx((0.0, 0.02, 0.06, 0.17))
    with pytest.raises(ValueError, match="trace.jsonl: 5 selected .* sent 6"):
        livetwin.registrations(trace, 6)


def test_median_itl_reads_the_last_result_of_each_run(tmp_path):
    dirs = []
    for k, itl in enumerate((8.0, 9.0, 7.0)):
        d = tmp_path / f"bench-stock-r{k}"
        d.mkdir()
        (d / "bench-gsp.jsonl").write_text(json.dumps({"median_itl_ms": 99.0}) + "\n"
                                           + json.dumps({"median_itl_ms": itl}) + "\n")
        dirs.append(d)
    assert livetwin.median_itl_s(dirs, "gsp") == pytest.approx(0.008)
    (dirs[0] / "bench-gsp.jsonl").write_text(json.dumps({"completed": 1}) + "\n")
    with pytest.raises(ValueError, match="no median_itl_ms"):
        livetwin.median_itl_s(dirs[:1], "gsp")


def test_replay_arrivals_in_send_order_and_refuses_what_it_cannot_map():
    segs = _gsp()
    got = livetwin.replay_arrivals(segs, [0.0, 0.01, 0.02, 0.05])
    assert [q.arrival_s for q in got[0]] == [0.0, 0.01, 0.02, 0.05]
    assert [q.qid for q in got[0]] == [q.qid for q in segs[0]]
    with pytest.raises(ValueError, match="4 questions, 3 live arrivals"):
        livetwin.replay_arrivals(segs, [0.0, 0.0, 0.0])
    closed = [replace(segs[0], questions=(segs[0].questions[0],
                                          replace(segs[0].questions[1], after="x")))]
    with pytest.raises(ValueError, match="open-loop"):
        livetwin.replay_arrivals(closed, [0.0, 0.0])


@pytest.mark.parametrize("host", [None, "model"])
def test_a_burst_at_zero_with_no_loop_host_is_the_default_twin(host):
    """All stamps 0 and the live ITL equal to the twin's own decode period: h = 0, latencies
    from the send = from the arrival, so `replay` reproduces the default twin exactly (with the
    same host model, if any)."""
    segs, cost = _gsp(), run_arms.twin_cost(MODEL, False)
    hc = host_model(host) if host else None
    plain = livetwin.run_twin(segs, "stock", MODEL, True, 0, cost, "extra_buffer", hc)
    facts = livetwin.LiveFacts((0.0,) * 4, livetwin.decode_period_s(plain), burst=True)
    got = livetwin.predict(segs, facts, MODEL, True, 0, cost, "extra_buffer",
                           run_arms.TWIN_KEYS, hc)
    assert got["h_s"] == 0.0 and ("free" if hc is None else "charged (fit") in got["note"]
    for arm in ("stock", "radixflow"):
        ref = run_arms.twin_prediction(run_arms.ArmSpec(arm, arm), segs, MODEL, True, 0, cost,
                                       "extra_buffer", hc)
        for k in ("latency_mean_s", "latency_p99_s", "ttft_mean_s", "rounds"):
            assert got["arms"][arm][k] == pytest.approx(ref[k]), (arm, k)


def test_the_trickle_and_the_loop_host_only_ever_add_latency():
    segs, cost = _gsp(), run_arms.twin_cost(MODEL, False)
    trickle = (0.0, 0.004, 0.008, 0.03)

    def step(arrivals):  # NOTE: the twin's own decode step on these arrivals: h = 0
        return livetwin.decode_period_s(livetwin.run_twin(
            livetwin.replay_arrivals(segs, arrivals), "stock", MODEL, False, 0, cost,
            "no_buffer"))

    def pred(arrivals, itl, burst=True):
        return livetwin.predict(segs, livetwin.LiveFacts(arrivals, itl, burst), MODEL, False,
                                0, cost, "no_buffer", run_arms.TWIN_KEYS)

    at_zero, spread = pred((0.0,) * 4, step((0.0,) * 4)), pred(trickle, step(trickle))
    dear, paced = pred(trickle, step(trickle) + 0.002), pred(trickle, step(trickle), False)
    assert at_zero["h_s"] == spread["h_s"] == paced["h_s"] == 0.0
    assert dear["h_s"] == pytest.approx(0.002) and "2.00 ms" in dear["note"]
    for arm in ("stock", "radixflow"):
        lat = [p["arms"][arm]["latency_mean_s"] for p in (at_zero, spread, dear)]
        assert lat[0] < lat[1] < lat[2], arm  # NOTE: from the send, the trickle counts
        # NOTE: a paced request's latency runs from its own arrival: the trickle does not count
        assert paced["arms"][arm]["latency_mean_s"] < spread["arms"][arm]["latency_mean_s"]
        assert "+ live loop host 2.00 ms" in dear["arms"][arm]["cost_model"]


def _live_gsp(tmp_path, per: int, system_len: int):
    """live_ab's gsp-burst of `per` x `per` requests, a stock run's ITL and no trace yet: (the
    workload, its args, the run directories, the runs)."""
    from eval import live_ab
    from eval.ab_report import RunRecord

    p = live_ab.build_parser()
    args = p.parse_args(["--out", str(tmp_path), "--workloads", "gsp-burst", "--gsp-groups",
                         str(per), "--gsp-prompts-per-group", str(per), "--gsp-system-len",
                         str(system_len), "--gsp-question-len", "16", "--output-len", "3"])
    live_ab.check_args(p, args)
    dirs = {a: tmp_path / f"bench-{a}" for a in ("stock", "radixflow")}
    for d in dirs.values():
        d.mkdir()
    (dirs["stock"] / "bench-gsp.jsonl").write_text(json.dumps({"median_itl_ms": 8.0}) + "\n")
    runs = [RunRecord("gsp-burst", a, 0, i, str(dirs[a]), {}) for i, a in enumerate(dirs)]
    return live_ab.make_workload("gsp-burst", args), args, dirs, runs


def test_live_ab_says_why_it_did_not_replay(tmp_path):
    """No radixflow trace, or no stock run: the replay twin is a note naming why, never a
    figure filled in."""
    from eval import live_ab

    w, args, dirs, runs = _live_gsp(tmp_path, 2, 512)
    cost = run_arms.twin_cost(MODEL, False)
    got = live_ab.live_twin(w, runs, w.twin_segments(), args, cost, "extra_buffer")
    assert "ratios" not in got and got["note"].startswith("not replayed")
    assert "trace.jsonl" in got["note"]
    _trace(dirs["radixflow"] / "trace.jsonl", [0.0, 5.0, 5.01, 5.02, 5.03])
    got = live_ab.live_twin(w, runs, w.twin_segments(), args, cost, "extra_buffer")
    assert got["ratios"]["mean_e2e_ms"] is not None and "4 arrivals replayed" in got["note"]
    got = live_ab.live_twin(w, runs[1:], w.twin_segments(), args, cost, "extra_buffer")
    assert got == {"note": "not replayed: needs a successful stock and radixflow run"}


def test_live_ab_bounds_the_learned_forks_with_every_fork_declared(tmp_path):
    """gsp: the replay twin also runs with every fork declared, on the same arrivals and loop
    time, against the same stock (which reads no declaration); knowing the forks from the first
    request never computes more prefill than learning them."""
    from eval import live_ab

    w, args, dirs, runs = _live_gsp(tmp_path, 3, 700)
    _trace(dirs["radixflow"] / "trace.jsonl", [0.0] + [5.0 + 0.001 * i for i in range(9)])
    cost = run_arms.twin_cost(MODEL, False)
    got = live_ab.live_twin(w, runs, w.twin_segments(), args, cost, "extra_buffer")
    bound = got["declared"]
    assert "every fork declared" in got["note"]
    assert f"{bound['ratios']['mean_e2e_ms']:.3f}x" in got["note"]
    same = [k for k in got["arms"]["stock"] if k != "wall_s"]  # NOTE: the twin's own run time
    assert [bound["arms"]["stock"][k] for k in same] == [got["arms"]["stock"][k] for k in same]
    learned, declared = (t["arms"]["radixflow"]["scheduled_tokens"] for t in (got, bound))
    assert declared <= learned
    assert declared < bound["arms"]["stock"]["scheduled_tokens"]
