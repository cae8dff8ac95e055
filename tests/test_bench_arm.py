"""bench_serving arms (eval/bench_arm.py, eval/run_arms.py --bench) and the fork comparison in
the live report (eval/arms_report.py): fast tests on the pieces, one slow run of SGLang's own
`python -m sglang.bench_serving` against a real stock and radixflow server."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from eval import arms_report, bench_arm, run_arms

ROOT = Path(__file__).resolve().parents[1]


def _parse(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as e:
        run_arms.build_parser().parse_args(["--out", "x", *argv])
    assert e.value.code == 2
    return capsys.readouterr().err


def test_bad_bench_value_names_the_flag_and_the_allowed_values(capsys):
    err = _parse(capsys, "--bench", "gsp,sharegpt")
    assert "--bench" in err and "'gsp,sharegpt'" in err
    assert "gsp, random-ids" in err and "none" in err
    assert "listed twice" in _parse(capsys, "--bench", "gsp,gsp")
    err = _parse(capsys, "--bench-policies", "stock,nope")
    assert "--bench-policies" in err and "radixflow" in err


def test_bench_values_parse():
    p = run_arms.build_parser()
    assert p.parse_args(["--out", "x"]).bench == []
    assert p.parse_args(["--out", "x", "--bench", "none"]).bench == []
    args = p.parse_args(["--out", "x", "--bench", "random-ids, gsp", "--bench-rate", "inf"])
    assert args.bench == ["random-ids", "gsp"] and math.isinf(args.bench_rate)
    assert args.bench_policies == ["stock", "radixflow"]


def test_no_replay_without_bench_is_refused(capsys):
    with pytest.raises(SystemExit) as e:
        run_arms.main(["--out", "x", "--no-replay"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--no-replay needs --bench" in err and "gsp, random-ids" in err


def test_default_shape_is_the_issues_and_its_prefix_once_work():
    args = run_arms.build_parser().parse_args(["--out", "x", "--bench", "gsp"])
    shape = run_arms.bench_shape(args)
    assert (shape.groups, shape.prompts_per_group, shape.system_len, shape.question_len,
            shape.output_len) == (16, 4, 2048, 64, 4)
    assert math.isinf(shape.rate) and shape.ids
    # issue 12: 16 x 2,112 + 48 x 64
    assert shape.prefix_once_tokens == 16 * 2112 + 48 * 64 == 36_864


def test_bench_cmd_is_upstreams_cli_with_the_shape():
    shape = bench_arm.BenchShape(2, 3, 100, 10, 5, rate=4.0, seed=7)
    gsp = bench_arm.bench_cmd("gsp", shape, "http://h:1", Path("/m"), Path("/o.jsonl"))
    assert gsp[1:3] == ["-m", "sglang.bench_serving"]

    def val(cmd, flag):
        return cmd[cmd.index(flag) + 1]

    assert val(gsp, "--dataset-name") == "generated-shared-prefix"
    assert [val(gsp, f) for f in ("--gsp-num-groups", "--gsp-prompts-per-group",
                                  "--gsp-system-prompt-len", "--gsp-question-len",
                                  "--gsp-output-len")] == ["2", "3", "100", "10", "5"]
    assert val(gsp, "--warmup-requests") == "0" and val(gsp, "--request-rate") == "4.0"
    assert val(gsp, "--backend") == "sglang" and val(gsp, "--tokenizer") == "/m"
    assert "--tokenize-prompt" in gsp and val(gsp, "--seed") == "7"
    rid = bench_arm.bench_cmd("random-ids", bench_arm.BenchShape(2, 3, 100, 10, 5, ids=False),
                              "http://h:1", Path("/m"), Path("/o.jsonl"))
    assert val(rid, "--dataset-name") == "random-ids" and "--tokenize-prompt" not in rid
    assert [val(rid, f) for f in ("--num-prompts", "--random-input-len",
                                  "--random-output-len", "--random-range-ratio")] == [
        "6", "110", "5", "1.0"]
    assert val(rid, "--request-rate") == "inf"


def test_bench_cmd_flags_exist_in_upstreams_parser(tmp_path):
    """Every flag we pass is one sglang/benchmark/serving.py cli_main defines."""
    import sglang.benchmark.serving as serving

    src = Path(serving.__file__).read_text()
    cmd = bench_arm.bench_cmd("gsp", bench_arm.BenchShape(), "u", Path("/m"), Path("/o"))
    cmd += bench_arm.bench_cmd("random-ids", bench_arm.BenchShape(), "u", Path("/m"), Path("/o"))
    cmd += _mooncake_cmd(_trace(tmp_path / "t.jsonl"))
    flags = {a for a in cmd if a.startswith("--")}
    missing = [f for f in flags if f'"{f}"' not in src]
    assert not missing, missing


def _trace(path: Path, n: int = 5) -> Path:
    path.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 600,
                                        "output_length": 2, "hash_ids": [0, i + 1]}) + "\n"
                            for i in range(n)))
    return path


def _mooncake_cmd(trace: Path, count: int = 3) -> list[str]:
    shape = bench_arm.BenchShape(trace_file=str(trace), trace_count=count, trace_speed=4.0)
    return bench_arm.bench_cmd("mooncake", shape, "u", Path("/m"), Path("/o"))


def test_mooncake_bench_reads_the_trace_files_first_records_at_its_speed(tmp_path):
    trace = _trace(tmp_path / "t.jsonl")
    cmd = _mooncake_cmd(trace)

    def val(flag):
        return cmd[cmd.index(flag) + 1]

    assert val("--dataset-name") == "mooncake" and val("--dataset-path") == str(trace)
    assert val("--num-prompts") == "3" and float(val("--mooncake-slowdown-factor")) == 0.25
    assert "--tokenize-prompt" not in cmd  # NOTE: the dataset's prompts are text
    whole = bench_arm.BenchShape(trace_file=str(trace))
    assert whole.requests_of("mooncake") == 5
    assert whole.requests_of("gsp") == whole.requests


def _result(**kw) -> dict:
    base = {"completed": 4, "duration": 0.5, "request_throughput": 8.0,
            "input_throughput": 1000.0, "output_throughput": 32.0, "total_input_tokens": 576,
            "total_output_tokens": 16, "mean_e2e_latency_ms": 200.0,
            "median_e2e_latency_ms": 190.0, "p99_e2e_latency_ms": 250.0, "mean_ttft_ms": 120.0,
            "median_ttft_ms": 110.0, "p99_ttft_ms": 150.0, "mean_tpot_ms": 20.0,
            "max_concurrent_requests": 4, "server_info": {"big": "x"},
            "cache_report": {"total_prompt_tokens": 576, "total_cached_tokens": 128}}
    return base | kw


def test_read_result_takes_the_last_line_and_names_the_file(tmp_path):
    out = tmp_path / "b.jsonl"
    with pytest.raises(ValueError, match="b.jsonl: bench_serving wrote no result"):
        bench_arm.read_result(out)
    out.write_text(json.dumps(_result(completed=1)) + "\n" + json.dumps(_result()) + "\n")
    assert bench_arm.read_result(out)["completed"] == 4
    out.write_text('{"completed": 4}\n{"torn')
    with pytest.raises(ValueError, match=r"b.jsonl line 2: malformed JSON"):
        bench_arm.read_result(out)


def test_fold_keeps_the_headline_fields_and_refuses_missing_completions():
    got = bench_arm.fold(_result(), 4)
    assert set(got) == set(bench_arm.BENCH_FIELDS) | {"client_cached_tokens",
                                                      "client_prompt_tokens"}
    assert got["mean_e2e_latency_ms"] == 200.0 and got["client_cached_tokens"] == 128
    assert "server_info" not in got
    with pytest.raises(ValueError, match="completed 3 of 4 requests"):
        bench_arm.fold(_result(completed=3), 4)
    with pytest.raises(ValueError, match="lacks mean_e2e_latency_ms"):
        bench_arm.fold({"completed": 4}, 4)


def test_server_counts_inside_the_window_only():
    batches = [(1, 144, 0), (3, 160, 288)]
    trace = [{"event": "round", "rows": 1, "scheduled_tokens": 6, "blocked": 0, "t_start": 1.0},
             {"event": "round", "rows": 1, "scheduled_tokens": 144, "blocked": 0,
              "t_start": 10.0},
             {"event": "round", "rows": 0, "scheduled_tokens": 0, "blocked": 3, "t_start": 10.1},
             {"event": "round", "rows": 3, "scheduled_tokens": 160, "blocked": 0,
              "t_start": 10.2},
             {"event": "round", "rows": 1, "scheduled_tokens": 9, "blocked": 0, "t_start": 30.0}]
    got = bench_arm.server_counts(batches, trace, (9.0, 20.0))
    assert got["rounds_sglang_log"] == 2 and got["scheduled_tokens_sglang_log"] == 304
    assert got["cached_tokens_sglang_log"] == 288 and got["rows_per_round_sglang_log"] == 2.0
    assert got["rounds_trace"] == 2 and got["scheduled_tokens_trace"] == 304
    assert got["blocked_trace"] == 3
    stock = bench_arm.server_counts(batches, None, (9.0, 20.0))
    assert stock["rounds_trace"] is None and stock["scheduled_tokens_trace"] is None


def _run(bench, policy, sched, e2e, *, error=None):
    r = bench_arm.BenchRun(bench, policy, command=f"bench {bench} {policy}")
    if error:
        r.error = error
        return r
    r.result = bench_arm.fold(_result(mean_e2e_latency_ms=e2e), 4)
    r.server = bench_arm.server_counts([(4, sched, 0)], None, (0.0, 1.0))
    return r


def test_summary_ratios_vs_stock_prefix_once_and_failures():
    shape = bench_arm.BenchShape(2, 2, 128, 16, 4)
    runs = [_run("gsp", "stock", 576, 200.0), _run("gsp", "radixflow", 320, 150.0),
            _run("random-ids", "stock", 576, 60.0),
            _run("random-ids", "radixflow", 0, 0.0, error="RuntimeError: boom")]
    s = bench_arm.summary(runs, shape)
    assert s["gsp"]["radixflow"]["vs_stock"]["scheduled_tokens"] == pytest.approx(320 / 576)
    assert s["gsp"]["radixflow"]["vs_stock"]["mean_e2e_latency_ms"] == pytest.approx(0.75)
    assert "vs_stock" not in s["gsp"]["stock"]
    assert shape.prefix_once_tokens == 2 * 128 + 4 * 16
    assert s["gsp"]["radixflow"]["scheduled_over_prefix_once"] == pytest.approx(320 / 320)
    assert "scheduled_over_prefix_once" not in s["random-ids"]["stock"]
    bad = s["random-ids"]["radixflow"]
    assert bad["failed"] and bad["error"] == "RuntimeError: boom"
    assert "bench_serving" not in bad and "server" not in bad


def _fork_arm(name: str, sched: int, lat: float, token: int) -> arms_report.LiveArm:
    m = {k: None for k in ("rounds", "rows_per_round", "tokens_per_round", "blocked",
                           "parked_max_rounds", "first_selection_mean_s", "l_cap",
                           "rounds_over_l_cap", "leaked_kv_slots", "leaked_mamba_slots",
                           "tokens_conserved", "offered_latency_mean_s",
                           "offered_latency_p95_s", "sender_lag_mean_s", "sender_lag_max_s",
                           "latency_p50_s", "latency_p99_s")}
    m |= {"scheduled_tokens_sglang_log": sched, "rounds_sglang_log": 4, "latency_mean_s": lat,
          "latency_p95_s": 2 * lat, "scheduled_tokens": sched, "hit_tokens": 10,
          "input_tokens": 100, "reuse": 0.1, "counters": "meta_info (no server trace)",
          "rounds": 4}
    recs = [{"rid": f"q/{x}", "output_ids": None, "text": str(token), "prompt_tokens": 20,
             "done_s": 1.0, "error": None} for x in "AB"]
    return arms_report.LiveArm(name, metrics=m, records=recs)


def test_fork_comparison_and_bench_land_in_summary_and_report(tmp_path):
    arms = {"stock-fork": _fork_arm("stock-fork", 4000, 0.5, 7),
            "radixflow-fork": _fork_arm("radixflow-fork", 1000, 0.25, 7)}
    bench = bench_arm.summary([_run("gsp", "stock", 576, 200.0),
                               _run("gsp", "radixflow", 320, 150.0)],
                              bench_arm.BenchShape(2, 2, 128, 16, 4))
    config = {"bench_shape": {"groups": 2}}
    summary = arms_report.write_outputs(tmp_path, config, arms, 1.0, bench=bench)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["bench"]["gsp"]["radixflow"]["bench_serving"]["mean_e2e_latency_ms"] == 150.0
    vs = on_disk["arms"]["radixflow-fork"]["vs_stock_fork"]
    assert vs["scheduled_tokens_sglang_log"] == pytest.approx(0.25)
    assert vs["latency_mean_s"] == pytest.approx(0.5)
    assert "vs_stock_fork" not in on_disk["arms"]["stock-fork"]
    fork_aud = summary["audit_fork"]["arms"]["radixflow-fork"]
    assert fork_aud["compared"] == 2 and fork_aud["agreed"] == 2
    report = (tmp_path / "report.md").read_text()
    assert "## Frontend program: stock-fork vs radixflow-fork" in report
    assert "| radixflow-fork | 1,000 | 0.25x | 4 | 1.00x | 0.250 | 0.50x |" in report
    assert "2 of 2 outputs agree" in report
    assert "## bench_serving" in report and "### gsp" in report
    assert "| radixflow | 4 | 320 | 0.56x | 1.00 |" in report
    assert "`bench gsp radixflow`" in report


def test_a_failed_bench_run_is_a_row_with_its_error(tmp_path):
    bench = bench_arm.summary([_run("gsp", "stock", 576, 200.0),
                               _run("gsp", "radixflow", 0, 0.0, error="ServerError: x|y")],
                              bench_arm.BenchShape(2, 2, 128, 16, 4))
    arms_report.write_outputs(tmp_path, {}, {}, 1.0, bench=bench)
    report = (tmp_path / "report.md").read_text()
    assert "| radixflow | FAILED: ServerError: x/y |" in report


@pytest.mark.live
@pytest.mark.slow
def test_bench_serving_against_stock_and_radixflow(tmp_path):
    """SGLang's own bench_serving, gsp then random-ids, one real server per policy."""
    out = tmp_path / "bench"
    cmd = [sys.executable, "-m", "eval.run_arms", "--no-replay", "--bench", "gsp,random-ids",
           "--bench-policies", "stock,radixflow", "--gsp-groups", "2",
           "--gsp-prompts-per-group", "2", "--gsp-system-len", "512", "--gsp-question-len",
           "16", "--bench-output-len", "3", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-6000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["arms"] == {} and summary["config"]["bench"] == ["gsp", "random-ids"]
    bench = summary["bench"]
    assert set(bench) == {"gsp", "random-ids"}
    for name, per in bench.items():
        assert set(per) == {"stock", "radixflow"}
        for policy, e in per.items():
            assert not e.get("failed"), (name, policy, e.get("error"))
            b, srv = e["bench_serving"], e["server"]
            assert b["completed"] == 4 and b["total_output_tokens"] == 4 * 3
            assert b["total_input_tokens"] == 4 * 528  # exact ids (--tokenize-prompt)
            # SGLang's log: every prompt token is either scheduled or a cache hit, once
            assert srv["scheduled_tokens_sglang_log"] + srv["cached_tokens_sglang_log"] \
                == b["total_input_tokens"], (name, policy, srv)
            assert b["client_cached_tokens"] == srv["cached_tokens_sglang_log"]
            assert math.isfinite(b["mean_e2e_latency_ms"]) and b["mean_ttft_ms"] > 0
            w = srv["witness"]  # NOTE: cumulative over the server's runs, warm-up included
            assert w["mismatched"] == 0 and w["verified"] >= b["completed"], w
            if policy == "radixflow":  # the trace agrees with SGLang's own log
                assert srv["scheduled_tokens_trace"] == srv["scheduled_tokens_sglang_log"]
                assert srv["rounds_trace"] == srv["rounds_sglang_log"]
                assert e["vs_stock"]["scheduled_tokens"] == pytest.approx(
                    srv["scheduled_tokens_sglang_log"]
                    / per["stock"]["server"]["scheduled_tokens_sglang_log"])
            else:
                assert srv["scheduled_tokens_trace"] is None
        log = (out / "bench-stock" / f"bench-{name}.log").read_text()
        assert "--warmup-requests 0" in log.splitlines()[0]
    report = (out / "report.md").read_text()
    assert "### gsp" in report and "### random-ids" in report
    assert "generated-shared-prefix" in report


def test_fork_arms_send_the_same_text_ids_arms_keep_their_own_namespace():
    from eval import client
    from eval.workload import Branch, Question

    specs = {s.name: s for s in run_arms.arm_specs(["stock", "radixflow"], fork_arm=True)}
    assert list(specs) == ["stock", "radixflow", "stock-fork", "radixflow-fork"]
    assert specs["stock-fork"].policy == "stock" and specs["stock-fork"].fork
    assert not specs["stock-fork"].traced and specs["radixflow-fork"].traced
    brs = tuple(Branch(f"q/{x}", [1, 2, 3, 10 + i], "cold/q", i) for i, x in enumerate("ABCD"))
    q = Question("q", "d", brs, prefix_len=3, doc_len=2)

    def text(name):
        return client.split_text(q, lambda ids: ",".join(map(str, ids)),
                                 run_arms.namespace_prefix(specs[name]))

    assert text("stock-fork") == text("radixflow-fork")
    assert run_arms.namespace_prefix(specs["stock"]) != run_arms.namespace_prefix(
        specs["radixflow"])
    assert [s.name for s in run_arms.arm_specs(["radixflow"], fork_arm=False)] == ["radixflow"]
