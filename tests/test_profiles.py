"""Issue 51: the simulated executor's cost profiles (radixflow_sglang/profiles.py) through the
config contract, the launcher, the twin and the live harnesses; the stock-lpm arm (SGLang's
scheduler with --schedule-policy lpm) in eval.replay, eval.run_arms and eval.live_ab's reports;
the sibling-after-completion workload's shape."""

from __future__ import annotations

import argparse
import json

import pytest

from eval import ab_report, cli, live_ab, profiles_report, replay, run_arms, traffic
from eval.ab_report import RunRecord
from radixflow_sglang import launch_server, profiles
from radixflow_sglang.config import ConfigError, config_from_env

MODEL = "qwen3.5-0.8b"


# --- the profiles ---------------------------------------------------------------------------


@pytest.mark.parametrize("model", sorted(profiles.TABLE9))
def test_the_paper_profile_reprices_both_table9_rounds_of_its_model(model):
    """alpha and beta are solved from the model's two rounds (gamma held): the simulated cost of
    each round's tokens and rows is the round's Table 9 cost."""
    cost = profiles.resolve("paper", model)
    assert cost.gamma == profiles.BOX["gamma"] and cost.alpha > 0 and cost.beta > 0
    for ms, tokens, rows in profiles.TABLE9[model]:
        assert cost(tokens, rows) == pytest.approx(ms * 1e-3, rel=1e-9)


def test_the_4b_solve_matches_the_references_own_reading():
    # NOTE: paper-figures.md: "Solving the two 4B points ... gives alpha ~ 50 ms, beta ~ 14 us"
    alpha, beta = profiles.solve("qwen3.5-4b")
    assert 49e-3 < alpha < 52e-3 and 14e-6 < beta < 15e-6


def test_box_is_the_old_default_and_each_variable_overrides_one_coefficient():
    assert profiles.resolve(None, None).as_dict() | {"source": ""} == {
        "profile": "box", "model": None, "alpha": 0.005, "beta": 2e-6, "gamma": 1e-4,
        "source": ""}
    env = {"RADIXFLOW_SIM_BETA": "1e-5"}
    c = profiles.resolve("paper", MODEL, env)
    assert c.beta == 1e-5 and c.alpha == profiles.solve(MODEL)[0]
    assert "RADIXFLOW_SIM_BETA=1e-5" in c.source and "paper Table 9" in c.source
    with pytest.raises(ValueError, match="RADIXFLOW_SIM_ALPHA: 'x' is not a number"):
        profiles.resolve("box", None, {"RADIXFLOW_SIM_ALPHA": "x"})


def test_profile_errors_name_the_setting_and_the_allowed_values():
    with pytest.raises(ValueError, match=r"--flag: invalid profile 'gpu' \(choose from box, "
                                         r"paper\)"):
        profiles.resolve("gpu", MODEL, name="--flag")
    with pytest.raises(ValueError, match=r"RADIXFLOW_SIM_PROFILE: profile paper has no Table 9 "
                                         r"row for model 'my-model' \(rows: qwen3.5-0.8b"):
        profiles.resolve("paper", "my-model")
    assert profiles.model_of("/x/model_dirs/qwen3.5-4b") == "qwen3.5-4b"
    assert profiles.model_of("/x/Qwen3.5-4B-Instruct") is None


def test_the_profile_travels_the_config_contract():
    assert config_from_env({}).sim_profile == "box"
    assert config_from_env({"RADIXFLOW_SIM_PROFILE": "paper"}).sim_profile == "paper"
    with pytest.raises(ConfigError, match=r"^RADIXFLOW_SIM_PROFILE: invalid choice 'gpu' "
                                          r"\(choose from box, paper\)$"):
        config_from_env({"RADIXFLOW_SIM_PROFILE": "gpu"})
    launch = launch_server.parse(["--radixflow-sim-profile", "paper"], env={})
    assert launch.config.sim_profile == "paper"
    assert launch.config.to_env()["RADIXFLOW_SIM_PROFILE"] == "paper"
    assert "sim_profile=paper" in launch.config.describe_settings()


def test_the_launcher_prices_the_served_model_and_refuses_an_unknown_one(capsys):
    cfg = launch_server.parse(["--radixflow-sim-profile", "paper"], env={}).config
    rest = ["--model-path", "/m/model_dirs/qwen3.5-4b"]
    cost = launch_server.sim_cost(cfg, rest, {"sim_profile": "--radixflow-sim-profile"}, env={})
    assert (cost.alpha, cost.beta) == profiles.solve("qwen3.5-4b")
    assert "cost profile paper" in cost.describe()
    with pytest.raises(SystemExit) as e:
        launch_server.sim_cost(cfg, ["--model-path=/m/other"], {"sim_profile":
                                                                "RADIXFLOW_SIM_PROFILE"}, env={})
    assert e.value.code == 2
    assert "RADIXFLOW_SIM_PROFILE: profile paper has no Table 9 row" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        launch_server.parse(["--radixflow-sim-profile", "gpu"], env={})
    assert ("argument --radixflow-sim-profile: invalid choice 'gpu' (choose from box, paper)"
            in capsys.readouterr().err)


def test_the_simulated_worker_reads_the_profile_from_its_environment(monkeypatch):
    from radixflow_sglang.adapter.simulated import CostModel

    monkeypatch.setenv("RADIXFLOW_SIM_PROFILE", "paper")
    monkeypatch.delenv("RADIXFLOW_SIM_ALPHA", raising=False)
    monkeypatch.setenv("RADIXFLOW_SIM_GAMMA", "0")
    c = CostModel("/x/model_dirs/qwen3.5-0.8b")
    alpha, beta = profiles.solve(MODEL)
    assert c(1000, 3) == pytest.approx(alpha + beta * 1000)
    assert c.sim.profile == "paper" and "RADIXFLOW_SIM_GAMMA=0" in c.sim.source


# --- the twin -------------------------------------------------------------------------------


def _replay_args(*argv: str) -> argparse.Namespace:
    return replay.build_parser().parse_args(["--model", MODEL, *argv])


def test_replay_profile_is_the_servers_cost_and_the_flags_override_it():
    paper = replay.replay_cost(_replay_args("--profile", "paper"))
    assert (paper.alpha, paper.beta) == profiles.solve(MODEL)
    assert paper.dec_alpha == paper.alpha and "cost profile paper" in paper.source
    over = replay.replay_cost(_replay_args("--profile", "box", "--alpha-ms", "7"))
    assert over.alpha == pytest.approx(7e-3) and over.beta == 2e-6
    plain = replay.replay_cost(_replay_args())
    assert plain.source.startswith("default:")  # NOTE: no --profile: the first-principles model


def test_arm_lists_take_stock_lpm_and_name_the_flag_on_errors(capsys):
    assert cli.arms("stock,stock-lpm") == ["stock", "stock-lpm"]
    assert cli.arm_policy("stock-lpm") == ("stock", "lpm")
    assert cli.arm_policy("radixflow") == ("radixflow", None)
    with pytest.raises(SystemExit):
        replay.build_parser().parse_args(["--policies", "stock,lpm"])
    err = capsys.readouterr().err
    assert "argument --policies: invalid choice: 'lpm'" in err and "stock-lpm" in err
    with pytest.raises(SystemExit):
        replay.build_parser().parse_args(["--profile", "gpu"])
    assert "argument --profile: invalid choice: 'gpu'" in capsys.readouterr().err


@pytest.mark.slow
def test_the_twin_runs_sglangs_lpm_as_its_own_arm(tmp_path):
    """stock-lpm is SGLang's real lpm ordering in the kit: on a gsp burst it schedules other
    batches than fcfs (more tokens here), computes the same outputs, and has its own rows."""
    out = tmp_path / "r"
    rc = replay.main(["--workload", "gsp", "--model", MODEL, "--policies", "stock,stock-lpm",
                      "--profile", "box", "--out", str(out), "--no-progress"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    arms = summary["arms"]
    assert set(arms) == {"stock", "stock-lpm"} and summary["config"]["profile"] == "box"
    assert arms["stock-lpm"]["scheduled_tokens"] != arms["stock"]["scheduled_tokens"]
    assert arms["stock-lpm"]["outputs_vs_stock"]["differing"] == 0
    report = (out / "report.md").read_text()
    assert "| stock-lpm |" in report and "cost profile box" in report


# --- the live harnesses' plumbing -----------------------------------------------------------


def test_run_arms_builds_the_lpm_arm_and_each_profiles_servers():
    specs = run_arms.arm_specs(["stock", "stock-lpm", "radixflow"], False)
    lpm = specs[1]
    assert (lpm.name, lpm.policy, lpm.schedule) == ("stock-lpm", "stock", "lpm")
    assert lpm.kit_overrides == {"schedule_policy": "lpm"} and not lpm.traced
    cmd = run_arms.server_cmd(lpm, "radixflow", ["--port", "1"], None, "paper")
    assert cmd[cmd.index("--schedule-policy") + 1] == "lpm"
    assert cmd[cmd.index("--radixflow-sim-profile") + 1] == "paper"
    gpu_cmd = run_arms.server_cmd(lpm, "sglang", [], None, None)
    assert "--radixflow-sim-profile" not in gpu_cmd and "--schedule-policy" in gpu_cmd
    assert run_arms.twin_host("auto", gpu=False) is not None  # NOTE: the calibrated model
    assert run_arms.twin_host("auto", gpu=True) is None
    assert run_arms.twin_cost(MODEL, False, "paper").alpha == profiles.solve(MODEL)[0]


def test_run_arms_profile_errors_name_the_flag_or_the_variable(monkeypatch, capsys):
    p = run_arms.build_parser()
    args = p.parse_args(["--out", "x", "--profiles", "box,paper"])
    assert run_arms.run_profiles(p, args, gpu=False) == ["box", "paper"]
    # NOTE: box first whatever the order given: its run's release lag serves the later twins
    later = p.parse_args(["--out", "x", "--profiles", "paper,box"])
    assert run_arms.run_profiles(p, later, gpu=False) == ["box", "paper"]
    with pytest.raises(SystemExit):
        run_arms.run_profiles(p, args, gpu=True)
    assert "--profiles: a GPU is visible" in capsys.readouterr().err
    monkeypatch.setenv("RADIXFLOW_SIM_PROFILE", "gpu")
    with pytest.raises(SystemExit):
        run_arms.run_profiles(p, p.parse_args(["--out", "x"]), gpu=False)
    assert "RADIXFLOW_SIM_PROFILE: invalid profile 'gpu'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        p.parse_args(["--out", "x", "--profiles", "box,box"])
    assert "argument --profiles: invalid value 'box,box'" in capsys.readouterr().err


def _summary(profile: str, stock: float, arms: dict[str, tuple[float, float]]) -> dict:
    """A run_arms summary.json: each arm's live and twin mean latency."""
    def arm(live: float, twin: float) -> dict:
        return {"latency_mean_s": live, "latency_p99_s": 2 * live, "scheduled_tokens": 100,
                "twin": {"latency_mean_s": twin, "latency_p99_s": 2 * twin,
                         "scheduled_tokens": 100}}

    return {"config": {"sim_cost": profiles.resolve(profile, MODEL).as_dict()},
            "arms": {"stock": arm(stock, stock)} | {n: arm(*v) for n, v in arms.items()}}


def test_profiles_report_puts_each_profiles_live_and_twin_ratios_side_by_side(tmp_path):
    per = {"box": _summary("box", 1.0, {"stock-lpm": (1.1, 1.0), "radixflow": (0.8, 0.6)}),
           "paper": _summary("paper", 2.0, {"radixflow": (1.0, 1.2)})}
    per["paper"]["arms"]["stock-lpm"] = {"failed": True, "error": "boom"}
    profiles_report.write_profiles(tmp_path, per)
    rows = json.loads((tmp_path / "profiles.json").read_text())
    rf = rows["box"]["arms"]["radixflow"]
    assert rf["live_mean"] == pytest.approx(0.8) and rf["twin_mean"] == pytest.approx(0.6)
    assert rf["gap_mean"] == pytest.approx(0.2)
    assert rows["paper"]["arms"]["radixflow"]["live_mean"] == pytest.approx(0.5)
    md = (tmp_path / "profiles.md").read_text()
    assert "| box | 5.00 ms + 2 us/tok | stock-lpm | 1.100 | 1.000 |" in md
    assert "| paper | 42.58 ms" in md and "FAILED: boom" in md


def _run(arm: str, k: int, mean: float) -> RunRecord:
    return RunRecord("w", arm, k, 0, figures={"mean_e2e_ms": mean, "p99_e2e_ms": mean})


def test_live_ab_pairs_the_lpm_arm_with_stock_and_gives_it_its_own_rows():
    assert ab_report.abba(2, ("stock", "radixflow", "stock-lpm")) == [
        (0, "stock"), (0, "radixflow"), (0, "stock-lpm"),
        (1, "stock-lpm"), (1, "radixflow"), (1, "stock")]
    runs = [_run("stock", 0, 10), _run("radixflow", 0, 5), _run("stock-lpm", 0, 12),
            _run("stock", 1, 20), _run("radixflow", 1, 20), _run("stock-lpm", 1, 18)]
    twin = {"default": {"ratios": {"mean_e2e_ms": 0.7}, "ratios_lpm": {"mean_e2e_ms": 1.0},
                        "note": "n"}}
    entry = ab_report.workload_entry("d", runs, twin, n=50)
    mean = entry["summary"]["mean_e2e_ms"]
    assert mean["ratios"] == [0.5, 1.0]
    assert mean["others"]["stock-lpm"]["ratios"] == [1.2, 0.9]
    assert entry["twin"]["default"]["gap_lpm"]["mean_e2e_ms"] == pytest.approx(0.05)
    table = "\n".join(ab_report.workload_table(entry))
    assert "stock-lpm/stock [95% CI]" in table and "| mean e2e (ms) | 15.0 | 15.0 |" in table


def test_live_ab_takes_the_sibling_workload_and_its_rate_only_with_it(capsys):
    p = live_ab.build_parser()
    args = p.parse_args(["--out", "x", "--workloads", traffic.SIBLING, "--sibling-rate", "4"])
    live_ab.check_args(p, args)
    w = live_ab.make_workload(traffic.SIBLING, args)
    assert w.arms == ("stock", "radixflow", "stock-lpm") and w.bench is None
    assert "rate 4.0" in w.describe and w.twin_segments() is w.segments
    noshare = live_ab.make_workload("noshare", args)
    assert noshare.arms == w.arms and len(noshare.segments[0]) == 64
    with pytest.raises(SystemExit):
        live_ab.check_args(p, p.parse_args(["--out", "x", "--sibling-rate", "4"]))
    assert "--sibling-rate applies to the workload sibling-after-completion only" in \
        capsys.readouterr().err


# --- the sibling-after-completion shape -----------------------------------------------------


def test_sibling_after_completion_sends_one_sibling_alone_then_the_rest_after_it():
    (seg,) = traffic.segments(traffic.SIBLING, MODEL, seed=3)
    qs = {q.qid: q for q in seg}
    firsts = [q for q in seg if q.after is None]
    assert len(seg) == 16 * 4 and len(firsts) == 16
    times = [q.arrival_s for q in firsts]
    assert times == sorted(times) and len(set(times)) == 16  # NOTE: Poisson, one at a time
    for q in seg:
        (b,) = q.branches
        assert b.boundary is None and b.max_new_tokens == 1 and len(b.input_ids) == 1024 + 64
        if q.after is not None:
            first = qs[q.after]
            assert first.after is None and q.arrival_s == 0.0  # NOTE: gap 0 after completion
            shared = first.branches[0].input_ids
            assert b.input_ids[:1024] == shared[:1024] and b.input_ids != shared
    assert traffic.describe(traffic.SIBLING)["rate"] == 2.0
    with pytest.raises(ValueError, match="--n does not apply to --workload "
                                         "sibling-after-completion"):
        traffic.segments(traffic.SIBLING, MODEL, n=2)


def test_a_profiles_forward_is_not_shortened_by_the_host_model():
    """The simulated executor sleeps the whole profile cost and scans on top: with a host model
    the twin charges the forward all of it (a GPU model's alpha holds the stock scan: there the
    host model takes the scan out)."""
    from types import SimpleNamespace

    from eval.costmodel import default_cost, profile_cost
    from eval.hostcost import gpu_cost, host_model

    rnd = SimpleNamespace(extend={"a": 1088}, prefix={"a": 0}, rids=["a"])
    host = host_model("model")
    sim = profile_cost("box", MODEL)
    assert gpu_cost(sim, host)(rnd) == sim.batch(rnd.extend, rnd.prefix) == pytest.approx(
        0.005 + 2e-6 * 1088 + 1e-4)
    gpu = default_cost(MODEL)
    assert gpu_cost(gpu, host)(rnd) < gpu.batch(rnd.extend, rnd.prefix)


def test_released_siblings_spread_like_the_live_servers_reproduce_its_stock_schedule():
    """Released together, a group's siblings share one round and stock recomputes them all; a
    live server registers them ~5-13 ms apart, so stock's first sibling runs alone and, its
    insert splitting the tree where the siblings part, the later ones hit the shared prefix.
    With the lag the twin schedules what the live stock server did (live smoke run, 8 groups:
    18,432 tokens = 8 x (1,088 + 1,088 + 64 + 64)); latency still counts from the release."""
    from eval.costmodel import profile_cost
    from eval.twin import run_arm
    from eval.workload import workload

    shape = traffic.make_shape(traffic.SIBLING, groups=2)
    full, tail = shape.system_len + shape.question_len, shape.question_len
    segs = workload(traffic.SIBLING, MODEL, groups=2)
    cost = profile_cost("box", MODEL)
    together = run_arm(segs, MODEL, "stock", cost=cost)
    spread = run_arm(segs, MODEL, "stock", cost=cost, release_lag_s=0.02)
    assert together.metrics["scheduled_tokens"] == 2 * 4 * full
    assert spread.metrics["scheduled_tokens"] == 2 * (2 * full + 2 * tail)
    sib = {q.qid: q for q in spread.questions}
    first = sib["g0.p0"]
    assert sib["g0.p3"].arrival_s == first.completion_s  # NOTE: counted from the release
    assert sib["g0.p3"].latency_s > 2 * 0.02


def test_release_lag_reads_the_live_registrations_of_each_released_group():
    (seg,) = traffic.segments(traffic.SIBLING, MODEL, groups=2)
    stamps = {"g0.p1": 1.0, "g0.p2": 1.010, "g0.p3": 1.010, "g1.p1": 5.0, "g1.p2": 5.004,
              "g1.p3": 5.012}
    events = [{"event": "selected", "rid": f"radixflow/{q.branches[0].rid}",
               "registered": stamps[q.qid]} for q in seg if q.qid in stamps]
    events.append({"event": "round", "rid": "x"})
    assert run_arms.release_lag(events, [seg], "radixflow/") == pytest.approx(0.0055)
    assert run_arms.release_lag(events, [seg], "stock/") is None  # NOTE: another arm's rids
    assert run_arms.release_lag(None, [seg], "radixflow/") is None


def test_the_twin_takes_the_loop_pass_of_the_first_traced_arm(tmp_path):
    from types import SimpleNamespace

    specs = [run_arms.ArmSpec.of(a) for a in ("stock", "radixflow", "timer5")]
    arms = {s.name: SimpleNamespace(ok=True) for s in specs}
    for name, passes in (("radixflow", (0.002, None, 0.004, 0.009)), ("timer5", (0.5,))):
        d = tmp_path / f"arm-{name}"
        d.mkdir()
        d.joinpath("trace.jsonl").write_text("".join(
            json.dumps({"event": "round", "rows": 1, "pass_s": p}) + "\n" for p in passes))
    assert run_arms.traced_loop_pass(arms, specs, tmp_path) == pytest.approx(0.004)
    arms["radixflow"].ok = False  # NOTE: a failed arm's trace is not read
    assert run_arms.traced_loop_pass(arms, specs, tmp_path) == pytest.approx(0.5)
    assert run_arms.traced_loop_pass({}, specs, tmp_path) is None
    # NOTE: live_ab's scans twin reads the same pass off its radixflow run, with a note
    ref = SimpleNamespace(dir=str(tmp_path / "arm-radixflow"))
    assert live_ab.live_loop_pass(ref) == (pytest.approx(0.004),
                                           "; loop pass 4.00 ms (live median of 3 scans)")
    assert live_ab.live_loop_pass(SimpleNamespace(dir=str(tmp_path))) == (
        0.0, f"; loop pass 0 (not read: [Errno 2] No such file or directory: "
             f"'{tmp_path / 'trace.jsonl'}')")


@pytest.mark.live
@pytest.mark.slow
def test_run_arms_runs_each_profile_with_the_lpm_arm_and_puts_them_side_by_side(tmp_path):
    """One command, two profiles, three arms each: every server ran the profile it was given
    (its /server_info says so), the twin used the calibrated host model and the box run's
    release lag, and profiles.md has a row per profile and arm."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "arms"
    cmd = [sys.executable, "-m", "eval.run_arms", "--model", MODEL, "--workload", traffic.SIBLING,
           "--groups", "2", "--policies", "stock,stock-lpm,radixflow", "--no-fork-arm",
           "--profiles", "paper,box", "--no-progress", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-6000:]
    lags = {}
    for prof in ("box", "paper"):
        summary = json.loads((out / f"profile-{prof}" / "summary.json").read_text())
        assert summary["config"]["sim_cost"]["profile"] == prof
        twin_model = summary["config"]["twin_model"]
        assert twin_model["host_cost"] is not None  # NOTE: not free scans
        lags[prof] = twin_model["release_lag_ms"]
        assert twin_model["loop_pass_ms"] > 0  # NOTE: the radixflow arm's traced loop pass
        for arm in ("stock", "stock-lpm", "radixflow"):
            info = json.loads((out / f"profile-{prof}" / f"arm-{arm}" /
                               "server_info.json").read_text())
            assert info["internal_states"][0]["sim_cost"]["profile"] == prof
            assert info["schedule_policy"] == ("lpm" if arm == "stock-lpm" else "fcfs")
            assert summary["arms"][arm]["twin"]["latency_mean_s"] > 0
    assert lags["box"] is not None and lags["paper"] == lags["box"]
    md = (out / "profiles.md").read_text()
    assert all(f"| {p} |" in md and f"| {a} |" in md for p in ("box", "paper")
               for a in ("stock-lpm", "radixflow"))


def test_spread_branches_reproduce_the_live_servers_two_rounds_per_question():
    """A live client sends a question's four branches at once, but they reach the scheduler
    ~0.6-0.8 ms apart (HTTP, tokenizer); the first finds an idle scheduler and runs alone, the
    others register after its forward (live paper mix, 0.8b: 99 of 144 questions in two
    rounds, ~200 rounds a run; the twin with them together: 150). With the spread the twin
    runs each question's first branch alone; latency still counts from the question's
    arrival."""
    from eval.costmodel import profile_cost
    from eval.twin import run_arm
    from eval.workload import workload

    segs = workload("synthetic", MODEL, regime="cold", order="forward", questions=3, rate=1.0)
    cost = profile_cost("box", MODEL)
    together = run_arm(segs, MODEL, "stock", cost=cost)
    spread = run_arm(segs, MODEL, "stock", cost=cost, branch_spread_s=0.0008)
    assert together.ok and spread.ok, (together.error, spread.error)
    # NOTE: 5 rounds together (a quality question's 4 x 3.4k tokens take two 8,192-token
    # rounds); spread, every question's first branch runs alone first
    assert together.metrics["rounds"] == 5
    assert spread.metrics["rounds"] == 6
    assert spread.metrics["scheduled_tokens"] != together.metrics["scheduled_tokens"]
    first = {q.qid: q.arrival_s for q in together.questions}
    assert all(q.arrival_s == first[q.qid] for q in spread.questions)
    assert all(q.latency_s > 0.005 for q in spread.questions)


def test_branch_spread_reads_the_clients_sends_per_question(tmp_path):
    path = tmp_path / "requests.jsonl"
    sends = {("s", "q0"): [1.0, 1.001, 1.002, 1.003], ("s", "q1"): [2.0, 2.0005],
             ("s", "q2"): [3.0]}
    path.write_text("".join(json.dumps({"segment": s, "qid": q, "send_s": t}) + "\n"
                            for (s, q), ts in sends.items() for t in ts))
    assert run_arms.branch_spread(path) == pytest.approx(0.00075)  # median of 1 and 0.5 ms
    assert run_arms.branch_spread(tmp_path / "missing.jsonl") is None
