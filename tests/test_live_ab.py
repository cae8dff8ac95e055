"""Live A/B harness (eval/live_ab.py, eval/ab_report.py): its pure parts on fabricated run
records (ABBA order, paired ratios and their bootstrap interval, the busy-machine warning,
summary.json, report.md and the plots), its argument errors, and one live end-to-end run
(two servers, one repetition, a tiny gsp burst)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eval import ab_report, live_ab
from eval.ab_report import Load, RunRecord
from eval.workload import workload

ROOT = Path(__file__).resolve().parents[1]
QUIET, BUSY = Load(0.2, 0.3, 0.4, 2), Load(1.5, 1.0, 0.5, 2)


def _runs(stock: list[float], radixflow: list[float], workload: str = "gsp-burst"
          ) -> list[RunRecord]:
    """Runs in ABBA order with mean e2e `stock[k]` / `radixflow[k]` (the other figures
    derived from it), every load quiet."""
    out = []
    for pos, (k, arm) in enumerate(ab_report.abba(len(stock))):
        v = (stock if arm == "stock" else radixflow)[k]
        figs = {"mean_e2e_ms": v, "p99_e2e_ms": 2 * v, "mean_ttft_ms": v / 2,
                "prefill_tokens": 1000.0 if arm == "stock" else 500.0, "prefill_batches": 10.0}
        out.append(RunRecord(workload, arm, k, pos, f"/x/{arm}-{k}", figs,
                             load_before=QUIET, load_after=QUIET, wall_s=1.0))
    return out


def test_abba_alternates_and_each_repetition_has_both_arms():
    order = ab_report.abba(3)
    assert order == [(0, "stock"), (0, "radixflow"), (1, "radixflow"), (1, "stock"),
                     (2, "stock"), (2, "radixflow")]


def test_paired_ratios_pair_by_repetition_and_skip_failures():
    runs = _runs([100, 200, 400], [50, 200, 100])
    assert ab_report.paired_ratios(runs, "mean_e2e_ms") == [0.5, 1.0, 0.25]
    runs[2].error, runs[2].figures = "ServerError: x", {}  # radixflow of repetition 1
    assert ab_report.paired_ratios(runs, "mean_e2e_ms") == [0.5, 0.25]
    assert ab_report.paired_ratios(runs, "mean_ttft_ms") == [0.5, 0.25]


def test_bootstrap_interval_is_seeded_and_brackets_the_median():
    xs = [0.8, 0.9, 1.0, 0.85, 0.95]
    a, b = ab_report.bootstrap_ci(xs), ab_report.bootstrap_ci(xs)
    assert a == b  # NOTE: a fixed seed: the same runs, the same report
    lo, hi = a
    assert min(xs) <= lo <= ab_report.median(xs) <= hi <= max(xs)
    assert ab_report.bootstrap_ci([1.1]) == (1.1, 1.1)
    assert ab_report.bootstrap_ci([]) is None


def test_load_warning_only_when_the_box_is_busy():
    assert ab_report.load_warning(QUIET, "run 0") is None
    w = ab_report.load_warning(BUSY, "gsp-burst #0")
    assert w.startswith("warning: busy machine before gsp-burst #0")
    assert "1.50 > 0.5 x 2 CPUs" in w
    assert ab_report.load_warning(BUSY, "x", fraction=1.0) is None
    now = ab_report.host_load()
    assert now.cpus >= 1 and now.load1 >= 0 and now.cpu_busy is None


def test_the_sampled_busy_share_decides_over_the_lagging_load():
    """Right after the harness's own server the 1-min load still counts it; the share of CPU
    time not idle between two /proc/stat readings is the box now."""
    assert ab_report.busy_share((100, 1000), (190, 1100)) == pytest.approx(0.1)
    assert ab_report.busy_share(None, (1, 2)) is None
    assert ab_report.busy_share((5, 10), (5, 10)) is None  # NOTE: no time passed
    lagging = Load(1.18, 0.6, 0.3, 2, cpu_busy=0.04)  # NOTE: a quiet box after a run
    assert ab_report.load_warning(lagging, "gsp-burst #1") is None
    w = ab_report.load_warning(Load(0.2, 0.2, 0.2, 2, cpu_busy=0.9), "gsp-burst #2")
    assert "CPUs 90% busy > 50%" in w


def test_cpu_times_reads_procs_cpu_line(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  10 2 30 400 5 0 1 0 0 0\ncpu0 5 1 15 200 2 0 0 0 0 0\n")
    assert ab_report.cpu_times(str(stat)) == (405, 448)
    assert ab_report.cpu_times(str(tmp_path / "none")) is None


def test_summary_medians_ratios_and_twin_gap():
    runs = _runs([100, 200, 400], [50, 200, 100])
    twin = {"default": {"ratios": {"mean_e2e_ms": 0.6, "prefill_tokens": 0.5}, "note": "n"}}
    e = ab_report.workload_entry("gsp", runs, twin)
    s = e["summary"]["mean_e2e_ms"]
    assert s["median"] == {"stock": 200, "radixflow": 100} and s["ratio"] == 0.5
    assert s["ratios"] == [0.5, 1.0, 0.25] and s["ci95"][0] <= 0.5 <= s["ci95"][1]
    assert e["summary"]["prefill_tokens"]["ratio"] == 0.5
    gap = e["twin"]["default"]["gap"]
    assert gap["mean_e2e_ms"] == pytest.approx(0.1) and gap["prefill_tokens"] == 0.0
    assert gap["p99_e2e_ms"] is None


def test_each_run_reports_its_schedulers_cpu():
    """The scheduler process's CPU over the replay sits beside the latency (the host work an
    arm adds), for the client's arms and bench_serving's alike, with its paired ratio."""
    from eval import bench_arm, live_ab

    f = live_ab.arm_figures({"latency_mean_s": 0.04, "latency_p99_s": 0.05,
                             "scheduler_cpu_s": 1.5})
    assert f["sched_cpu_ms"] == 1500.0 and f["mean_e2e_ms"] == 40.0
    run = bench_arm.BenchRun("gsp", "radixflow", result={},
                             server={"scheduler_cpu_s": 0.25})
    assert live_ab.bench_figures(run)["sched_cpu_ms"] == 250.0
    assert live_ab.arm_figures({})["sched_cpu_ms"] is None
    runs = _runs([100, 200], [50, 100])
    for r in runs:
        r.figures["sched_cpu_ms"] = 1000.0 if r.arm == "stock" else 1100.0
    assert ab_report.paired_ratios(runs, "sched_cpu_ms") == [1.1, 1.1]


def test_twin_ratios_from_predictions():
    s = {"latency_mean_s": 0.2, "latency_p99_s": 0.4, "ttft_mean_s": 0.1,
         "scheduled_tokens": 1000, "rounds": 10}
    r = dict(s, latency_mean_s=0.1, scheduled_tokens=400)
    out = ab_report.twin_ratios(s, r)
    assert out["mean_e2e_ms"] == 0.5 and out["prefill_tokens"] == 0.4
    assert out["prefill_batches"] == 1.0
    assert set(ab_report.twin_ratios(s, {"failed": True}).values()) == {None}


def _summary(workloads: dict) -> dict:
    cfg = {"model": "qwen3.5-0.8b", "executor": "simulated", "overlap": False,
           "server_args": "--disable-overlap-schedule", "repeat": 3, "bootstrap": 2000,
           "seed": 0, "cpus": 2}
    return {"config": cfg, "warnings": [], "workloads": workloads}


def test_report_and_plot_from_fabricated_runs(tmp_path):
    runs = _runs([100, 200, 400], [50, 200, 100])
    runs[3].warning = ab_report.load_warning(BUSY, "gsp-burst #3")
    twin = {"default": {"ratios": {"mean_e2e_ms": 0.6}, "note": "simulated executor"},
            "calibrated": {"note": "not calibrated (too few rounds)"}}
    fork = _runs([10, 20, 40], [10, 20, 40], "fork")
    fork[0].error, fork[0].figures = "ServerError: boom", {}
    summary = _summary({"gsp-burst": ab_report.workload_entry("gsp burst", runs, twin),
                        "fork": ab_report.workload_entry("fork(4)", fork, {}, "none: text")})
    summary["warnings"] = [runs[3].warning]
    ab_report.write(tmp_path, summary)
    md = (tmp_path / "report.md").read_text()
    assert "## Warnings" in md and "busy machine before gsp-burst #3" in md
    assert "| mean e2e (ms) | 200.0 | 100.0 | **0.500x** [" in md
    assert "twin (default)" in md and "0.600" in md and "0.100" in md
    assert "not calibrated (too few rounds)" in md and "twin: none: text" in md
    assert "FAILED: ServerError: boom" in md and "**busy**" in md
    assert "![gsp-burst](plot-gsp-burst.png)" in md
    for name in ("gsp-burst", "fork"):
        png = tmp_path / f"plot-{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    back = json.loads((tmp_path / "summary.json").read_text())
    assert back["workloads"]["gsp-burst"]["summary"]["mean_e2e_ms"]["ratio"] == 0.5
    assert back["workloads"]["gsp-burst"]["runs"][0]["load_before"]["cpus"] == 2


def test_a_workload_without_pairs_has_no_plot(tmp_path):
    runs = _runs([100], [50])
    runs[1].error, runs[1].figures = "x", {}
    entry = ab_report.workload_entry("w", runs, {})
    assert not ab_report.plot_workload("w", entry, tmp_path / "p.png")
    assert not (tmp_path / "p.png").exists()


def _error(capsys, *argv: str) -> str:
    p = live_ab.build_parser()
    with pytest.raises(SystemExit) as e:
        live_ab.check_args(p, p.parse_args(["--out", "x", *argv]))
    assert e.value.code == 2
    return capsys.readouterr().err


def test_argument_errors_name_the_flag_and_the_allowed_values(capsys, tmp_path):
    err = _error(capsys, "--workloads", "gsp,nope")
    assert "--workloads" in err and "gsp-burst, gsp-paced, mooncake, trace, paper, fork" in err
    assert "each once" in _error(capsys, "--workloads", "fork,fork")
    assert "--workloads mooncake needs --trace-file" in _error(capsys, "--workloads", "mooncake")
    assert "--trace-speed applies to the workloads mooncake, trace" in _error(
        capsys, "--trace-speed", "2")
    assert "--questions applies to the workloads paper, fork" in _error(
        capsys, "--questions", "3")
    assert "--repeat" in _error(capsys, "--repeat", "0")
    for layout in (["--mamba-radix-cache-strategy", "no_buffer"],
                   ["--mamba-radix-cache-strategy=no_buffer"]):
        err = _error(capsys, "--overlap", f"--server-args={' '.join(layout)}")
        assert "--overlap" in err and "no_buffer" in err and "extra_buffer" in err
    assert "--server-args: No closing quotation" in _error(capsys, "--server-args=--x 'y")
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, '
                     '"hash_ids": [1]}\n{"timestamp": 5}\n')
    err = _error(capsys, "--workloads", "trace", "--trace-file", str(trace))
    assert f"{trace} line 2" in err
    trace.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, '
                     '"hash_ids": [1]}\n' * 2)
    assert "use 0:N, not 1:1" in _error(capsys, "--workloads", "mooncake", "--trace-file",
                                        str(trace), "--trace-window", "1:1")


def test_workloads_map_onto_run_arms_machinery():
    p = live_ab.build_parser()
    args = p.parse_args(["--out", "x", "--workloads", "gsp-burst,gsp-paced,fork",
                         "--paced-rate", "3", "--output-len", "2", "--questions", "1"])
    live_ab.check_args(p, args)
    burst, paced, fork = (live_ab.make_workload(n, args) for n in args.workloads)
    assert burst.bench == paced.bench == "gsp" and burst.shape.output_len == 2
    assert burst.shape.rate == float("inf") and paced.shape.rate == 3.0
    assert "3 req/s" in paced.describe and burst.twin_segments is not None
    assert [s.name for s in fork.specs.values()] == ["stock-fork", "radixflow-fork"]
    # NOTE: the lpm arm joins every workload but the fork programs (SGLang's frontend)
    assert fork.arms == ("stock", "radixflow") and burst.arms == ("stock", "radixflow",
                                                                  "stock-lpm")
    assert fork.twin_segments is None and "re-tokenizes" in fork.twin_note
    twin = paced.twin_segments()
    assert len(twin[0]) == 16 * 4  # the same gsp shape for the twin
    # NOTE: bench_serving declares no boundary: neither does the twin's copy
    assert all(b.boundary is None for q in twin[0] for b in q.branches)
    assert any(b.boundary for q in workload("gsp", "qwen3.5-0.8b")[0] for b in q.branches)


def test_the_trace_workload_sends_the_twins_blocks(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 700,
                                         "output_length": 2, "hash_ids": [0, i + 1]}) + "\n"
                             for i in range(4)))
    p = live_ab.build_parser()
    args = p.parse_args(["--out", "x", "--workloads", "trace,mooncake", "--trace-file",
                         str(trace), "--trace-window", "0:3", "--trace-speed", "2"])
    live_ab.check_args(p, args)
    tr, mc = (live_ab.make_workload(n, args) for n in args.workloads)
    assert tr.bench is None and [s.name for s in tr.specs.values()] == ["stock", "radixflow",
                                                                        "stock-lpm"]
    assert tr.specs["stock-lpm"].policy == "stock" and tr.specs["stock-lpm"].schedule == "lpm"
    assert [len(q.branches[0].input_ids) for q in tr.segments[0]] == [700] * 3
    assert tr.twin_segments() is tr.segments  # NOTE: the twin replays what was sent
    assert mc.bench == "mooncake" and mc.shape.requests_of("mooncake") == 3
    assert mc.shape.trace_speed == 2.0 and "first 3 records" in mc.describe


@pytest.mark.live
@pytest.mark.slow
def test_live_ab_two_servers_one_repetition(tmp_path):
    """Three real servers (stock, radixflow, stock-lpm), one repetition of a tiny gsp burst:
    every run completes, the report has its tables (stock-lpm's own rows), plot and twin, the
    load and the cost profile are recorded."""
    out = tmp_path / "ab"
    cmd = [sys.executable, "-m", "eval.live_ab", "--workloads", "gsp-burst", "--repeat", "1",
           "--gsp-groups", "2", "--gsp-prompts-per-group", "2", "--gsp-system-len", "512",
           "--gsp-question-len", "16", "--output-len", "3", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-6000:]
    summary = json.loads((out / "summary.json").read_text())
    entry = summary["workloads"]["gsp-burst"]
    assert [(r["arm"], r["error"]) for r in entry["runs"]] == [
        ("stock", None), ("radixflow", None), ("stock-lpm", None)]
    lpm = entry["summary"]["mean_e2e_ms"]["others"]["stock-lpm"]
    assert len(lpm["ratios"]) == 1 and lpm["ratio"] > 0
    assert entry["twin"]["default"]["ratios_lpm"]["mean_e2e_ms"] is not None
    info = json.loads((Path(entry["runs"][2]["dir"]) / "server_info.json").read_text())
    assert info["schedule_policy"] == "lpm"
    assert info["internal_states"][0]["sim_cost"]["profile"] == "box"
    assert summary["config"]["sim_cost"]["profile"] == "box"
    for r in entry["runs"]:
        assert r["load_before"]["cpus"] >= 1 and r["load_after"] is not None
        assert r["figures"]["prefill_batches"] >= 1 and r["figures"]["mean_e2e_ms"] > 0
        assert r["figures"]["sched_cpu_ms"] > 0
    assert len(entry["summary"]["mean_e2e_ms"]["ratios"]) == 1
    assert entry["twin"]["default"]["ratios"]["mean_e2e_ms"] is not None
    scans = entry["twin"]["scans"]  # NOTE: the same twin with its scans charged
    assert scans["ratios"]["mean_e2e_ms"] is not None and "measured" in scans["note"]
    assert scans["arms"]["radixflow"]["host"].startswith("measured")
    assert "note" in entry["twin"]["calibrated"]
    live = entry["twin"]["replay"]  # NOTE: the live run's 4 arrivals and loop host replayed
    assert live["ratios"]["mean_e2e_ms"] is not None, live["note"]
    assert "4 arrivals replayed" in live["note"] and "ms per iteration" in live["note"]
    assert "twin (scans)" in (out / "report.md").read_text()
    assert (out / "plot-gsp-burst.png").exists()
    report = (out / "report.md").read_text()
    assert "## gsp-burst" in report and "stock-lpm/stock" in report
    assert "Cost profile **box**" in report


def test_the_twin_charges_its_scans_when_given_a_host_model():
    """`scans`' plumbing: run_arms.twin_prediction with a host model charges each scan's host
    time (the deterministic `model` here; live_ab passes `measured`): later, never sooner."""
    from eval import run_arms
    from eval.hostcost import host_model
    from eval.requests import undeclared

    segs = undeclared(workload("gsp", "qwen3.5-0.8b", groups=2, prompts_per_group=2,
                               system_len=512, question_len=16, output_len=2))
    cost = run_arms.twin_cost("qwen3.5-0.8b", False)
    spec = run_arms.ArmSpec("radixflow", "radixflow")
    free = run_arms.twin_prediction(spec, segs, "qwen3.5-0.8b", False, 0, cost, "no_buffer")
    charged = run_arms.twin_prediction(spec, segs, "qwen3.5-0.8b", False, 0, cost, "no_buffer",
                                       host_model("model"))
    assert free["host"] is None and charged["host"].startswith("fit:")
    assert not free.get("failed") and not charged.get("failed")
    assert charged["latency_mean_s"] > free["latency_mean_s"]
    assert charged["scheduled_tokens"] == free["scheduled_tokens"]  # NOTE: the same schedule
