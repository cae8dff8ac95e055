"""Live replay client (eval/client.py), arms driver (eval/run_arms.py), calibration
(eval/calibrate.py): fast unit tests on fake records and traces, and one slow end-to-end run
of four real servers (stock, radixflow, and the frontend fork program against a stock and a
radixflow server)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from eval import arms_report, calibrate, client
from eval.twin import METRIC_KEYS

ROOT = Path(__file__).resolve().parents[1]


def _row(seg: int, qid: str, k: int, *, offered: float, q_send: float, done: float,
         prompt: int = 100, cached: int = 0, server_rid: str | None = None, **kw) -> dict:
    rid = f"s{seg}/{qid}/{'ABCD'[k]}"
    return {"segment": seg, "segment_name": f"seg{seg}", "regime": "reuse" if seg else "cold",
            "qid": qid, "rid": rid, "option": k, "namespace": "ns", "input_len": prompt,
            "offered_s": offered, "q_send_s": q_send, "send_s": q_send + 0.001 * k,
            "done_s": done, "server_rid": server_rid or rid, "output_ids": [7 + k],
            "text": "x", "prompt_tokens": prompt, "cached_tokens": cached, "error": None, **kw}


def _fake_rows() -> list[dict]:
    # q0: offered 10.0, sent 10.5 (lag 0.5), done 11.0 -> latency 0.5, offered latency 1.0
    # q1: offered 12.0, sent 12.0, done 12.25 -> latency 0.25
    rows = [_row(0, "q0", k, offered=10.0, q_send=10.5, done=10.8 + 0.05 * k,
                 cached=0 if k == 0 else 64) for k in range(4)]
    rows += [_row(1, "q1", k, offered=12.0, q_send=12.0, done=12.1 + 0.05 * k, cached=96)
             for k in range(4)]
    return rows


def _fake_trace() -> list[dict]:
    def rnd(n, t, rows, tokens, hit, blocked=0, **kw):
        return {"event": "round", "round": n, "rows": rows, "scheduled_tokens": tokens,
                "hit_tokens": hit, "blocked": blocked, "t_start": t, "t_end": t + 0.001,
                "held": 0, "chunked": False, "wait_set": 0, **kw}

    sel = [{"event": "selected", "rid": f"s0/q0/{x}", "registered": 10.5,
            "first_selected": 10.6 + 0.1 * (x != "A"), "first_selected_round": 2 + (x != "A"),
            "rounds_parked": int(x != "A")} for x in "ABCD"]
    return [
        rnd(1, 5.0, 1, 6, 0),  # server warm-up: before the replay, ignored
        rnd(2, 10.6, 1, 100, 0, blocked=3), rnd(3, 10.7, 3, 108, 192), rnd(4, 10.75, 0, 0, 0,
                                                                           blocked=1),
        rnd(5, 12.05, 4, 16, 384),
        rnd(6, 20.0, 1, 1, 0),  # a health check after the replay, ignored
        *sel,
    ]


def test_question_timings_latency_lag_and_offered_latency():
    qs = {q.qid: q for q in client.questions(_fake_rows())}
    assert qs["q0"].latency_s == pytest.approx(10.95 - 10.5)
    assert qs["q0"].offered_latency_s == pytest.approx(10.95 - 10.0)
    assert qs["q0"].sender_lag_s == pytest.approx(0.5)
    assert qs["q1"].latency_s == pytest.approx(0.25) and qs["q1"].sender_lag_s == 0.0


def test_summary_without_trace_derives_tokens_and_leaves_rounds_unknown(tmp_path):
    raw = tmp_path / "requests.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in _fake_rows()))
    m = client.summarize(client.read_jsonl(raw), None, leaks={"kv": 0, "mamba": 0},
                         l_caps={"seg0": 1, "seg1": 1}, budgets={"rows": 16, "tokens": 8192})
    assert all(k in m for k in METRIC_KEYS)
    assert m["requests"] == 8 and m["questions"] == 2
    assert m["input_tokens"] == 800 and m["hit_tokens"] == 3 * 64 + 4 * 96
    assert m["scheduled_tokens"] == 800 - m["hit_tokens"]
    assert m["reuse"] == pytest.approx(m["hit_tokens"] / 800)
    for k in client.UNKNOWN_WITHOUT_TRACE:
        assert m[k] is None, k
    assert m["rounds_over_l_cap"] is None and m["l_cap"] == 2
    assert m["latency_mean_s"] == pytest.approx((0.45 + 0.25) / 2)
    assert m["offered_latency_mean_s"] == pytest.approx((0.95 + 0.25) / 2)
    assert m["sender_lag_mean_s"] == pytest.approx(0.25) and m["sender_lag_max_s"] == 0.5
    assert set(m["per_regime"]) == {"cold", "reuse"}
    assert m["per_regime"]["cold"]["latency_mean_s"] == pytest.approx(0.45)
    assert m["leaked_kv_slots"] == 0


def test_summary_with_trace_counts_rounds_inside_the_replay_windows_only():
    m = client.summarize(_fake_rows(), _fake_trace(), l_caps={"seg0": 2, "seg1": 1})
    assert m["rounds"] == 3  # rounds 2, 3, 5 launched a batch inside the windows
    assert m["scheduled_tokens"] == 100 + 108 + 16
    assert m["rows_per_round"] == pytest.approx(8 / 3)
    assert m["tokens_per_round"] == pytest.approx(224 / 3)
    assert m["blocked"] == 4  # a parked-only round counts too
    assert m["parked_max_rounds"] == 1
    assert m["rounds_over_l_cap"] == pytest.approx(1.0)
    # first selection: trace first_selected - the branch's send time (q0's branches only)
    sends = [10.5 + 0.001 * k for k in range(4)]
    firsts = [10.6, 10.7, 10.7, 10.7]
    assert m["first_selection_mean_s"] == pytest.approx(
        sum(f - s for f, s in zip(firsts, sends, strict=True)) / 4)
    assert m["per_segment"]["seg1"]["rounds"] == 1
    assert m["per_segment"]["seg0"]["blocked"] == 4


def test_a_failed_request_fails_the_summary_and_is_never_filled_in():
    rows = _fake_rows()
    rows[2]["error"] = "RuntimeError: HTTP 500"
    with pytest.raises(ValueError, match="1 of 8 requests failed"):
        client.summarize(rows, None)


def test_torn_last_trace_line_is_dropped(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text('{"event": "round"}\n{"event": "sel')
    assert client.read_jsonl(p) == [{"event": "round"}]
    assert client.load_trace(tmp_path / "missing.jsonl") is None


def test_generate_body_carries_rid_and_namespace():
    from eval.workload import Branch

    s = client.GenerateSender("http://x", pool=1, namespace_prefix="arm/", rid_prefix="arm/")
    try:
        body = s.body(Branch("q/A", [1, 2, 3], "reuse/d1", 0))
    finally:
        s.close()
    assert body == {"input_ids": [1, 2, 3], "rid": "arm/q/A", "extra_key": "arm/reuse/d1",
                    "sampling_params": {"max_new_tokens": 1, "temperature": 0,
                                        "ignore_eos": True}}


def test_fork_text_opens_with_the_namespace_tag():
    from eval.workload import Branch, Question

    brs = tuple(Branch(f"q/{x}", [1, 2, 3, 10 + i], "cold/q", i) for i, x in enumerate("ABCD"))
    q = Question("q", "d", brs, prefix_len=3, doc_len=2)
    prefix, rests = client.split_text(q, lambda ids: ",".join(map(str, ids)), "fork/")
    assert prefix == "[fork/cold/q]\n1,2,3" and rests == ["10", "11", "12", "13"]


def test_audit_keeps_differing_pairs():
    base = arms_report.LiveArm("stock", records=_fake_rows())
    other_rows = _fake_rows()
    other_rows[1]["output_ids"] = [999]
    other = arms_report.LiveArm("radixflow", records=other_rows)
    aud = arms_report.audit({"stock": base, "radixflow": other})
    a = aud["arms"]["radixflow"]
    assert aud["ran"] and a["compared"] == 8 and a["agreed"] == 7 and a["differing"] == 1
    assert a["pairs"][0]["arm"] == [999] and a["pairs"][0]["stock"] == [8]
    assert not arms_report.audit({"radixflow": other})["ran"]


def test_calibrate_recovers_a_known_cost_from_scan_gaps():
    alpha, beta, gamma = 0.005, 2e-6, 1e-4
    events, t = [], 0.0
    shapes = [(1, 4000), (3, 500), (2, 8000), (4, 100), (1, 64), (2, 3000), (4, 6000)]
    for n, (rows, tokens) in enumerate(shapes, start=1):
        events.append({"event": "round", "round": n, "rows": rows, "scheduled_tokens": tokens,
                       "chunked": True, "wait_set": 0, "held": 0, "t_start": t,
                       "t_end": t + 1e-4})
        t += alpha + beta * tokens + gamma * rows
    events.append({"event": "round", "round": 99, "rows": 1, "scheduled_tokens": 5,
                   "chunked": False, "wait_set": 0, "held": 0, "t_start": t + 5, "t_end": t + 5})
    recs = calibrate.forward_records(events)
    assert len(recs) == len(shapes) - 1  # the last one has no next scan; 99 is not consecutive
    cost, used, total = calibrate.calibrate(events)
    assert (used, total) == (6, 8)
    assert cost.alpha == pytest.approx(alpha, rel=1e-6)
    assert cost.beta == pytest.approx(beta, rel=1e-6)
    assert cost.gamma == pytest.approx(gamma, rel=1e-4)


def test_calibrate_drops_idle_gaps_and_holds():
    base = {"event": "round", "scheduled_tokens": 10, "rows": 1, "wait_set": 0}
    events = [
        base | {"round": 1, "chunked": False, "held": 0, "t_start": 0.0, "t_end": 0.001},
        base | {"round": 2, "chunked": True, "held": 0, "t_start": 9.0, "t_end": 9.001},
        base | {"round": 3, "chunked": True, "held": 2, "t_start": 9.5, "t_end": 9.501},
        base | {"round": 4, "chunked": False, "held": 0, "t_start": 9.6, "t_end": 9.601},
        {"event": "selected", "rid": "r", "registered": 9.0005, "first_selected": 9.6,
         "first_selected_round": 4},
    ]
    # 1 -> 2: idle (nothing waiting); 2 -> 3: a hold in the gap; 3 -> 4: busy (chunk), used
    assert calibrate.forward_records(events) == [
        {"rows": 1, "scheduled_tokens": 10, "duration_s": pytest.approx(0.1)}]


def test_calibrate_fits_the_measured_wall_periods_when_the_trace_has_them():
    """A server's `forward` event j carries the wall period of forward j - 1's round
    (`period_s`; None after an idle loop): those are the records, the scan gaps unused."""
    alpha, beta, gamma = 0.02, 3e-6, 2e-4
    shapes = [(1, 4000), (3, 500), (2, 8000), (4, 100), (1, 64), (2, 3000), (4, 6000)]
    events, prev = [], None
    for n, (rows, tokens) in enumerate(shapes):
        period = None if prev is None or n == 4 else alpha + beta * prev[1] + gamma * prev[0]
        events.append({"event": "forward", "round": n, "rows": rows, "scheduled_tokens": tokens,
                       "duration_s": 0.001, "period_s": period})
        events.append({"event": "round", "round": n, "rows": rows, "scheduled_tokens": tokens,
                       "chunked": False, "wait_set": 0, "held": 0, "t_start": 9.0 * n,
                       "t_end": 9.0 * n})  # NOTE: idle gaps: the old rule would use none
        prev = (rows, tokens)
    recs = calibrate.forward_records(events)
    assert [(r["rows"], r["scheduled_tokens"]) for r in recs] == [
        shapes[i] for i in (0, 1, 2, 4, 5)]  # round 3's period: the loop went idle after it
    cost, used, total = calibrate.calibrate(events)
    assert (used, total) == (5, 7)
    assert (cost.alpha, cost.beta, cost.gamma) == pytest.approx((alpha, beta, gamma), rel=1e-4)


@pytest.mark.live
@pytest.mark.slow
def test_run_arms_end_to_end(tmp_path):
    out = tmp_path / "arms"
    cmd = [sys.executable, "-m", "eval.run_arms", "--policies", "stock,radixflow", "--fork-arm",
           "--workload", "synthetic", "--questions", "4", "--rate", "20", "--out", str(out),
           "--no-progress"]
    # NOTE: a hang bound: four servers start one after another on a busy 2-core machine
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-6000:]
    summary = json.loads((out / "summary.json").read_text())
    arms = summary["arms"]
    assert set(arms) == {"stock", "radixflow", "stock-fork", "radixflow-fork"}
    for name, m in arms.items():
        assert not m.get("failed"), (name, m.get("error"))
        missing = [k for k in METRIC_KEYS if k not in m]
        assert not missing, (name, missing)
        assert m["requests"] == 6 * 4 * 4  # 3 regimes x 2 orders x 4 questions x 4 branches
    # no trace for stock: its rounds are counted from SGLang's own per-batch log lines
    assert arms["stock"]["rounds_source"] == "sglang log"
    assert arms["stock"]["rounds"] == arms["stock"]["rounds_sglang_log"] > 0
    assert arms["radixflow"]["rounds"] > 0 and arms["radixflow-fork"]["rounds"] > 0
    # the same frontend program against a stock server: counted from SGLang's log, compared
    assert arms["stock-fork"]["rounds_source"] == "sglang log"
    assert arms["stock-fork"]["scheduled_tokens_sglang_log"] > 0
    vs = arms["radixflow-fork"]["vs_stock_fork"]
    assert vs["scheduled_tokens_sglang_log"] == pytest.approx(
        arms["radixflow-fork"]["scheduled_tokens_sglang_log"]
        / arms["stock-fork"]["scheduled_tokens_sglang_log"])
    fork_aud = summary["audit_fork"]["arms"]["radixflow-fork"]
    assert fork_aud["compared"] == 96 and fork_aud["agreed"] == 96  # same text, same tokens
    # NOTE: no cross-arm reuse comparison here: live arrivals make it timing-dependent (the
    # arms' ratios are eval/run_arms.py's report); each arm's count must match its own records
    for name in arms:
        rows = client.read_jsonl(out / f"arm-{name}" / "requests.jsonl")
        assert arms[name]["hit_tokens"] == sum(r.get("cached_tokens") or 0 for r in rows), name
    assert arms["radixflow"]["leaked_kv_slots"] == 0
    assert summary["audit"]["ran"]
    aud = summary["audit"]["arms"]["radixflow"]
    assert aud["compared"] == 96 and aud["agreed"] == 96  # same ids, deterministic executor
    assert (out / "report.md").exists() and (out / "audit.json").exists()
    report = (out / "report.md").read_text()
    assert "Table 1" in report and "## Frontend program: stock-fork vs radixflow-fork" in report
    assert summary["config"]["stock_cmd"] in ("sglang", "radixflow")
    assert math.isfinite(arms["radixflow"]["latency_mean_s"])
    for name in arms:
        assert (out / f"arm-{name}" / "requests.jsonl").exists()


def test_rounds_from_sglangs_own_prefill_log_lines(tmp_path):
    from eval.run_arms import add_log_rounds, prefill_log_lines

    log = tmp_path / "server.log"
    log.write_text(
        "[t] Prefill batch, #new-seq: 1, #new-token: 6, #cached-token: 0, full token usage: 0\n"
        "[t] unrelated line\n"
        "[t] Prefill batch, #new-seq: 3, #new-token: 120, #cached-token: 5952, mamba usage: 0\n"
        "[t] Prefill batch, #new-seq: 1, #new-token: 2040, #cached-token: 0, mamba usage: 0\n")
    batches = prefill_log_lines(log)
    assert batches == [(1, 6, 0), (3, 120, 5952), (1, 2040, 0)]
    stock = {"rounds": None}
    add_log_rounds(stock, batches[1:])  # the first line came before the replay
    assert stock["rounds"] == 2 and stock["rows_per_round"] == 2.0
    assert stock["scheduled_tokens_sglang_log"] == 2160 and stock["rounds_source"] == "sglang log"
    traced = {"rounds": 7}
    add_log_rounds(traced, batches)
    assert traced["rounds"] == 7 and traced["rounds_sglang_log"] == 3  # the trace wins
