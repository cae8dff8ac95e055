"""eval/run_arms.py on the traffic workloads (issues 12 and 15): --workload with eval.replay's
shape flags, one arm per radixflow boundary mode, the twin's prediction next to the live
figures in report.md. Fast tests on the pieces (the twin runs on the kit) and one slow run of
two real servers on a small gsp-paced shape."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from eval import arms_report, run_arms
from eval.arms_report import LiveArm

ROOT = Path(__file__).resolve().parents[1]
MODEL = "qwen3.5-0.8b"
SMALL_PACED = ["--workload", "gsp-paced", "--groups", "2", "--prompts-per-group", "3",
               "--system-len", "300", "--question-len", "260", "--output-len", "2"]


def _args(*argv: str):
    p = run_arms.build_parser()
    args = p.parse_args(["--out", "x", *argv])
    return args, run_arms.check_args(p, args)


def _error(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        _args(*argv)
    assert e.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--workload", "gsp", "--regime", "cold"], "--regime applies to the paper workloads"),
    (["--workload", "gsp-paced", "--questions", "4"], "--questions applies to the paper"),
    (["--workload", "gsp", "--n", "4"], "--n does not apply to --workload gsp"),
    (["--workload", "synthetic", "--groups", "3"], "--groups applies to --workload gsp"),
    (["--workload", "gsp-paced", "--fork-arm"], "--fork-arm sends the paper's four-branch"),
    (["--boundaries", "learned,nope"], "argument --boundaries: invalid value 'learned,nope'"),
    (["--boundaries", "learned,learned"], "each once"),
    (["--policies", "stock", "--boundaries", "learned"], "--boundaries applies to the radixflow"),
    (["--workload", "nsample", "--nsample-mode", "hot"], "argument --nsample-mode"),
    (["--overlap", "--server-args", "--mamba-radix-cache-strategy no_buffer"],
     "--overlap: the no_buffer layout"),
    (["--server-args", "--served-model-name 'a b"],
     "--server-args: No closing quotation in \"--served-model-name 'a b\""),
])
def test_bad_workload_flags_name_the_flag(argv, message, capsys):
    assert message in _error(capsys, *argv)


def test_paper_defaults_traffic_defaults_and_the_fork_arm():
    args, shape = _args("--workload", "synthetic")
    assert (args.regime, args.order, args.questions, args.rate) == ("all", "both", 16, 5.0)
    assert args.fork_arm is True and shape == {}
    args, shape = _args(*SMALL_PACED)
    assert args.rate is None and args.regime is None and args.fork_arm is False
    assert shape == {"groups": 2, "prompts_per_group": 3, "system_len": 300,
                     "question_len": 260, "output_len": 2}
    args, _ = _args("--workload", "gsp", "--no-fork-arm", "--rate", "inf")
    assert args.fork_arm is False and args.rate == float("inf")


def test_an_arm_per_boundary_mode_and_its_server_flag():
    specs = run_arms.arm_specs(["stock", "radixflow"], False, ["both", "learned", "off"])
    assert [(s.name, s.policy, s.boundaries) for s in specs] == [
        ("stock", "stock", "both"), ("radixflow", "radixflow", "both"),
        ("radixflow-learned", "radixflow", "learned"), ("radixflow-off", "radixflow", "off")]

    def cmd(spec):
        return run_arms.server_cmd(spec, "radixflow", ["--port", "1"], Path("t.jsonl"))

    learned = cmd(specs[2])
    assert learned[learned.index("--radixflow-boundaries") + 1] == "learned"
    # the server's default mode keeps the paper arm's command; stock gets no radixflow flag
    assert "--radixflow-boundaries" not in cmd(specs[1])
    assert not any(a.startswith("--radixflow-b") for a in cmd(specs[0]))
    forks = run_arms.arm_specs(["radixflow"], True, ["learned"])
    assert [s.name for s in forks] == ["radixflow-learned", "stock-fork", "radixflow-fork"]


def test_nsample_warm_sends_sglangs_n_and_the_twin_keeps_the_warm_question():
    args, shape = _args("--workload", "nsample", "--nsample-mode", "warm", "--prompts", "2",
                        "--n", "3", "--prompt-len", "40", "--output-len", "2")
    segs = run_arms.build_segments(args, shape)
    assert [q.qid for q in segs[0].questions] == ["p0.warm", "p0", "p1.warm", "p1"]
    sent = run_arms.live_segments(segs, n_param=True)
    assert [q.qid for q in sent[0].questions] == ["p0", "p1"]
    assert all(q.after is None for q in sent[0].questions)
    assert run_arms.live_segments(segs, n_param=False) is segs


def test_twin_cost_is_the_simulated_executors():
    from radixflow_sglang.adapter.simulated import CostModel as SimCost

    sim, twin = SimCost(), run_arms.twin_cost(MODEL, gpu=False)
    for rows, tokens in [(1, 2048), (4, 300), (16, 8192)]:
        assert twin(rows, tokens) == pytest.approx(sim(tokens, rows))
        # a decode step is one forward of one token per row
        assert twin.decode(rows, 10_000) == pytest.approx(sim(rows, rows))


def test_server_layout_from_server_info(tmp_path):
    assert run_arms.server_layout(tmp_path) == "extra_buffer"  # no file
    (tmp_path / "server_info.json").write_text(json.dumps(
        {"internal_states": [{"mamba_radix_cache_strategy": "no_buffer"}]}))
    assert run_arms.server_layout(tmp_path) == "no_buffer"
    (tmp_path / "server_info.json").write_text(json.dumps({"mamba_radix_cache_strategy":
                                                           "auto"}))
    assert run_arms.server_layout(tmp_path) == "extra_buffer"


def test_twin_prediction_on_gsp_paced_declared_boundaries_serve_every_follower():
    args, shape = _args(*SMALL_PACED)
    segs = run_arms.build_segments(args, shape)
    cost = run_arms.twin_cost(MODEL, gpu=False)
    stock, rf = run_arms.arm_specs(["stock", "radixflow"], False)
    t_stock = run_arms.twin_prediction(stock, segs, MODEL, False, 0, cost, "extra_buffer")
    t_rf = run_arms.twin_prediction(rf, segs, MODEL, False, 0, cost, "extra_buffer")
    for t in (t_stock, t_rf):
        assert not t.get("failed"), t.get("error")
        assert set(run_arms.TWIN_KEYS) <= set(t) and t["layout"] == "extra_buffer"
        assert t["requests"] == 6 and t["after_requests"] == 4
        assert t["scheduled_tokens"] + t["hit_tokens"] == t["input_tokens"] == 6 * 560
    # stock publishes the first request's state near its end (512), past the shared 300
    assert t_stock["zero_hit_after_requests"] == 4
    # the declared boundary (300) publishes at its grid floor: every follower resumes there
    assert t_rf["zero_hit_after_requests"] == 0 and t_rf["hit_tokens"] > 0


def test_a_twin_failure_is_recorded_never_filled_in():
    args, shape = _args(*SMALL_PACED)
    segs = run_arms.build_segments(args, shape)
    spec = run_arms.ArmSpec("radixflow", "radixflow")
    t = run_arms.twin_prediction(spec, segs, MODEL, False, 0, run_arms.twin_cost(MODEL, False),
                                 "sideways")
    assert t["failed"] and t["error"] and "scheduled_tokens" not in t


def _metrics(sched_log: int, zero_after: int, lat: float, trace: bool) -> dict:
    return {"scheduled_tokens_sglang_log": sched_log, "scheduled_tokens": sched_log,
            "counters": "radixflow trace" if trace else "meta_info (no server trace)",
            "zero_hit_requests": zero_after + 2, "zero_hit_after_requests": zero_after,
            "after_requests": 6, "latency_mean_s": lat, "latency_p95_s": 2 * lat,
            "request_latency_mean_s": lat / 2}


def _twin(sched: int, zero_after: int, lat: float) -> dict:
    return {"layout": "extra_buffer", "cost_model": "simulated executor",
            "scheduled_tokens": sched, "zero_hit_requests": zero_after + 2,
            "zero_hit_after_requests": zero_after, "after_requests": 6,
            "latency_mean_s": lat, "latency_p95_s": lat, "request_latency_mean_s": lat}


def test_report_puts_live_and_twin_side_by_side_with_ratios_vs_stock(tmp_path):
    arms = {"stock": LiveArm("stock", metrics=_metrics(4000, 6, 0.4, False),
                             twin=_twin(3000, 6, 0.2)),
            "radixflow": LiveArm("radixflow", metrics=_metrics(1000, 0, 0.1, True),
                                 twin=_twin(1500, 1, 0.1)),
            "radixflow-learned": LiveArm("radixflow-learned", metrics=_metrics(2000, 3, 0.2,
                                                                                True),
                                         twin={"layout": "extra_buffer", "failed": True,
                                               "cost_model": "simulated executor",
                                               "error": "ValueError: boom"})}
    rows = {r[0]: r for r in arms_report.prefill_rows(arms)}
    h = arms_report.PREFILL_HEADERS
    rf, st, le = rows["radixflow"], rows["stock"], rows["radixflow-learned"]
    assert rf[h.index("scheduled (SGLang log)")] == "1,000" and rf[2] == "0.25x"
    assert rf[h.index("twin scheduled")] == "1,500" and rf[h.index("twin vs stock")] == "0.50x"
    assert rf[h.index("zero-hit followers")] == "0 / 6" and rf[h.index("zero-hit followers")
                                                                 + 1] == "1 / 6"
    assert st[h.index("scheduled (trace)")] == "-" and rf[h.index("scheduled (trace)")] == "1,000"
    assert le[h.index("twin scheduled")] == "-" and le[h.index("vs stock")] == "0.50x"
    summary = arms_report.arm_summary(arms["radixflow"], arms["stock"])
    assert summary["twin"]["vs_stock"]["scheduled_tokens"] == pytest.approx(0.5)
    text = "\n".join(arms_report.prefill_lines({"n_param": False}, arms))
    assert "twin for radixflow-learned FAILED: ValueError: boom" in text
    assert "simulated executor cost model" in text


@pytest.mark.live
@pytest.mark.slow  # two real servers (stock, radixflow), minutes each on 2 busy cores
def test_run_arms_gsp_paced_end_to_end(tmp_path):
    out = tmp_path / "paced"
    cmd = [sys.executable, "-m", "eval.run_arms", "--policies", "stock,radixflow",
           *SMALL_PACED, "--server-args", "--mamba-radix-cache-strategy extra_buffer",
           "--out", str(out), "--no-progress"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-6000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["shape"]["system_len"] == 300
    assert summary["config"]["fork_arm"] is False
    arms = summary["arms"]
    assert set(arms) == {"stock", "radixflow"}
    for name, m in arms.items():
        assert not m.get("failed"), (name, m.get("error"))
        assert m["requests"] == 6 and m["after_requests"] == 4
        assert m["twin"]["layout"] == "extra_buffer" and not m["twin"].get("failed")
        assert m["twin"]["requests"] == 6
        # what SGLang's own log says it scheduled is the prompt less what it served cached
        assert m["scheduled_tokens_sglang_log"] == m["input_tokens"] - m["hit_tokens"]
        assert m["scheduler_cpu_s"] > 0  # the scheduler child's CPU over the replay
    rf = arms["radixflow"]
    # the declared boundary went with every request: every follower found the shared state
    assert rf["zero_hit_after_requests"] == 0 and rf["scheduled_tokens"] == rf[
        "scheduled_tokens_sglang_log"]
    assert rf["scheduled_tokens_sglang_log"] < arms["stock"]["scheduled_tokens_sglang_log"]
    report = (out / "report.md").read_text()
    assert "## Scheduled prefill, zero-hit followers, latency: live and twin" in report
    assert "0 / 4" in report


def test_gsp_reports_scheduled_over_the_prefix_once_work():
    shape = {"workload": "gsp", "groups": 16, "prompts_per_group": 4, "system_len": 2048,
             "question_len": 64}
    assert arms_report.prefix_once_tokens(shape) == 36_864  # issue 12's figure
    assert arms_report.prefix_once_tokens({"workload": "noshare"}) is None
    arms = {"stock": LiveArm("stock", metrics=_metrics(73_728, 0, 0.4, False),
                             twin=_twin(36_864, 0, 0.2))}
    text = "\n".join(arms_report.prefix_once_lines(shape, arms))
    assert "- stock: live 2.00x, twin 1.00x" in text and "36,864 tokens" in text


# --- --bench-repeat: alternated servers (the live latency gap, issue 12) ----------------------


def test_bench_repeat_alternates_policies_abba_and_refuses_zero(capsys):
    assert run_arms.bench_order(["stock", "radixflow"], 3) == [
        (0, "stock"), (0, "radixflow"), (1, "radixflow"), (1, "stock"),
        (2, "stock"), (2, "radixflow")]
    assert run_arms.bench_order(["stock", "radixflow"], 1) == [(0, "stock"), (0, "radixflow")]
    args, _ = _args("--no-replay", "--bench", "gsp", "--bench-repeat", "2")
    assert args.bench_repeat == 2
    err = _error(capsys, "--no-replay", "--bench", "gsp", "--bench-repeat", "0")
    assert "--bench-repeat" in err


def _bench_run(policy: str, repeat: int, e2e: float, cpu: float, sched: int = 100):
    from eval import bench_arm

    r = bench_arm.BenchRun("gsp", policy, command=f"bench {policy} {repeat}", repeat=repeat)
    r.result = bench_arm.fold({"completed": 4, "mean_e2e_latency_ms": e2e,
                               "mean_ttft_ms": e2e / 2, "p99_e2e_latency_ms": 2 * e2e}, 4)
    r.server = bench_arm.server_counts([(4, sched, 0)], None, (0.0, 1.0))
    r.server["scheduler_cpu_s"] = cpu
    return r


def test_bench_repeats_pair_each_alternation_with_stocks_and_report_the_median(tmp_path):
    from eval import bench_arm

    # alternation k of radixflow against stock's alternation k: 2.0x, 0.5x, 0.9x -> median 0.9
    runs = [_bench_run("stock", 0, 100.0, 1.0), _bench_run("radixflow", 0, 200.0, 1.2),
            _bench_run("radixflow", 1, 60.0, 0.8), _bench_run("stock", 1, 120.0, 1.0),
            _bench_run("stock", 2, 100.0, 1.0), _bench_run("radixflow", 2, 90.0, 1.1, 80)]
    s = bench_arm.summary(runs, bench_arm.BenchShape(2, 2, 128, 16, 4))
    rf = s["gsp"]["radixflow"]
    assert rf["bench_serving"]["mean_e2e_latency_ms"] == 200.0  # the first alternation's
    assert rf["vs_stock"]["mean_e2e_latency_ms"] == pytest.approx(2.0)
    got = [p["mean_e2e_latency_ms"] for p in rf["vs_stock_repeats"]]
    assert got == pytest.approx([2.0, 0.5, 0.9])
    assert rf["vs_stock_median"]["mean_e2e_latency_ms"] == pytest.approx(0.9)
    assert rf["vs_stock_median"]["scheduler_cpu_s"] == pytest.approx(1.1)
    assert rf["vs_stock_median"]["scheduled_tokens"] == pytest.approx(1.0)
    assert [r["repeat"] for r in s["gsp"]["stock"]["repeats"]] == [0, 1, 2]
    assert "vs_stock_median" not in s["gsp"]["stock"]
    arms_report.write_outputs(tmp_path, {}, {}, 1.0, bench=s)
    report = (tmp_path / "report.md").read_text()
    assert "| radixflow | 1 | 60.0 | 30.0 | 120.0 | 100 | 1 | 0.80 |" in report
    assert "radixflow vs stock, median over 3 alternations: mean_e2e_latency_ms 0.90x" in report


def test_a_single_alternation_keeps_todays_summary(tmp_path):
    from eval import bench_arm

    s = bench_arm.summary([_bench_run("stock", 0, 100.0, 1.0),
                           _bench_run("radixflow", 0, 150.0, 1.0)],
                          bench_arm.BenchShape(2, 2, 128, 16, 4))
    assert "repeats" not in s["gsp"]["radixflow"]
    assert s["gsp"]["radixflow"]["vs_stock"]["scheduler_cpu_s"] == pytest.approx(1.0)
    arms_report.write_outputs(tmp_path, {}, {}, 1.0, bench=s)
    assert "Alternations" not in (tmp_path / "report.md").read_text()


def test_scheduler_cpu_seconds_are_read_from_the_scheduler_child_only():
    """The CPU figure is the OS's count for a child whose process name has "scheduler" (as
    SGLang's setproctitle names it); other children and the launcher are not counted."""
    from eval import bench_arm

    code = ("import setproctitle, sys, time\n"
            "setproctitle.setproctitle(sys.argv[1])\n"
            "t = time.process_time()\n"
            "while time.process_time() - t < float(sys.argv[2]): pass\n"
            "sys.stdout.write('done\\n'); sys.stdout.flush(); sys.stdin.read()\n")
    launcher = subprocess.Popen(["sleep", "60"])
    kids = []
    try:
        import psutil

        for title, spin in (("sglang::scheduler", "0.3"), ("sglang::detokenizer", "0.3")):
            kids.append(subprocess.Popen([sys.executable, "-c", code, title, spin],
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True))
        for k in kids:
            assert k.stdout.readline() == "done\n"  # its CPU time is spent
        # NOTE: psutil walks real children; give the fake launcher our children by pid
        me = psutil.Process().pid
        cpu = bench_arm.scheduler_cpu_s(me)
        sched_cpu = sum(psutil.Process(kids[0].pid).cpu_times()[:2])
        assert cpu >= 0.3 and cpu == pytest.approx(sched_cpu, abs=0.05)
        assert bench_arm.scheduler_cpu_s(launcher.pid) == 0.0  # no scheduler child
    finally:
        for k in kids:
            k.kill()
            k.wait()
        launcher.kill()
        launcher.wait()


def test_sigterm_stops_the_running_server(tmp_path):
    """A run killed by SIGTERM (e.g. `timeout`) stops the server it started: the server runs
    in a session of its own, so nothing else would."""
    import os
    import signal

    child = ("import sys, time\n"
             "from pathlib import Path\n"
             "from eval.run_arms import sigterm_exits\n"
             "from radixflow_sglang.testing.server import Server, free_port\n"
             "sigterm_exits()\n"
             "srv = Server(['sleep', '600'], {}, Path(sys.argv[1]), free_port())\n"
             "with srv:\n"
             "    print(srv.proc.pid, flush=True)\n"
             "    while True: time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", child, str(tmp_path / "s.log")], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True)
    server_pid = None
    try:
        server_pid = int(proc.stdout.readline())
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
        with pytest.raises(ProcessLookupError):
            os.killpg(server_pid, 0)  # the server's whole group is gone
    finally:
        proc.kill()
        proc.wait()
        if server_pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server_pid, signal.SIGKILL)  # NOTE: a failed run leaves no orphan
