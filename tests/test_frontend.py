"""Issue 51: the live front end in the twin (eval/frontend.py). The fit recovers a known
c + sum (a + b * tokens) from synthetic live records and leaves out questions a forward
delayed; the twin's branches reach its scheduler when the model says; the CLIs and the live
harnesses take it and say which model is in force."""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import replace

import pytest

from eval import frontend, live_ab, replay, run_arms
from eval.ab_report import RunRecord
from eval.frontend import FrontEnd

MODEL = "qwen3.5-0.8b"
C, A, B, BACK = 4.4e-3, 0.5e-3, 0.35e-6, 0.011


def _live(c: float, a: float, b: float, questions: int = 30, branches: int = 4,
          seed: int = 0, noise: float = 0.0) -> tuple[list[dict], list[dict]]:
    """(client records, trace events) of a live run whose front end is exactly (c, a, b) (each
    branch + N(0, noise)) and whose responses reach the client BACK after their forward: each
    question's branches registered in turn, then one forward; records in a shuffled order."""
    rng = random.Random(seed)
    records, events = [], []
    for qi in range(questions):
        send, t = 1.0 + qi, 1.0 + qi + c
        for j in range(branches):
            n = rng.choice((300, 1200, 3000)) + rng.randrange(50)
            t += a + b * n
            rid = f"radixflow/seg/q{qi}/{j}"
            records.append({"segment": 0, "qid": f"q{qi}", "q_send_s": send,
                            "send_s": send + 2e-4 * j, "input_len": n, "server_rid": rid,
                            "max_new_tokens": 1, "done_s": send + 0.5 + BACK})
            events += [{"event": "selected", "rid": rid, "registered": t + rng.gauss(0, noise)},
                       {"event": "admitted", "round": qi, "rid": rid}]
        _forward_over(events, send + 0.1, send + 0.5, qi)
    rng.shuffle(records)
    return records, events


def _forward_over(events: list[dict], t0: float, t1: float, number: int = -1) -> None:
    """A prefill round whose scan starts at t0 and whose forward ends at t1."""
    events += [{"event": "round", "round": number, "t_start": t0, "t_end": t0 + 1e-3},
               {"event": "forward", "round": number, "duration_s": t1 - t0 - 1e-3}]


def test_the_fit_recovers_a_known_front_end():
    records, events = _live(C, A, B)
    fe = frontend.fit(frontend.observations(records, events), "synthetic",
                      frontend.back_delays(records, events))
    assert (fe.c_s, fe.a_s, fe.b_s, fe.back_s) == pytest.approx((C, A, B, BACK), rel=1e-6)
    assert fe.questions == 30 and fe.resid_s == pytest.approx(0.0, abs=1e-9)
    assert fe.jitter_s == pytest.approx(0.0, abs=1e-9)


def test_the_fit_reads_a_branchs_own_spread_about_its_question():
    """Each branch registered N(0, 0.3 ms) off the model: the pooled sd about each question's
    mean recovers 0.3 ms (a whole question's shift would not count)."""
    records, events = _live(C, 2e-3, B, questions=400, noise=0.3e-3)
    fe = frontend.fit(frontend.observations(records, events), "noisy")
    assert fe.jitter_s == pytest.approx(0.3e-3, rel=0.08)
    assert (fe.c_s, fe.a_s, fe.b_s) == pytest.approx((C, 2e-3, B), rel=0.1)


def test_the_fit_leaves_out_a_question_a_forward_delayed():
    records, events = _live(C, A, B)
    for e in events:  # NOTE: question 0 (sent at 1.0) registered only after a 50 ms forward
        if e["event"] == "selected" and "/q0/" in e["rid"]:
            e["registered"] += 0.05
    skewed = frontend.fit(frontend.observations(records, events), "skewed")
    assert skewed.c_s > C + 1e-3  # NOTE: what the filter must prevent
    _forward_over(events, 1.0005, 1.05, 99)
    obs = frontend.observations(records, events)
    fe = frontend.fit(obs, "filtered")
    assert len(obs) == 29 and (fe.c_s, fe.a_s, fe.b_s) == pytest.approx((C, A, B), rel=1e-6)


def test_single_branch_questions_fold_a_into_c_and_too_few_fit_nothing():
    records, events = _live(C, A, B, branches=1)
    fe = frontend.fit(frontend.observations(records, events), "one branch")
    assert (fe.c_s, fe.a_s, fe.b_s) == pytest.approx((C + A, 0.0, B), rel=1e-6)
    few = _live(C, A, B, questions=frontend.MIN_QUESTIONS - 1)
    assert frontend.fit(frontend.observations(*few), "few") is None


def test_offsets_parse_and_describe():
    fe = frontend.parse("4,0.5,0.25")
    assert fe.offsets([1000, 2000]) == pytest.approx([4.75e-3, 5.75e-3])
    noisy = frontend.parse("4,0.5,0.25,1,10")
    assert (noisy.jitter_s, noisy.back_s) == pytest.approx((1e-3, 1e-2))
    drawn = noisy.offsets([1000, 2000], "q0/A")
    assert drawn == noisy.offsets([1000, 2000], "q0/A") != noisy.offsets([1000, 2000], "q1/A")
    assert drawn != pytest.approx([4.75e-3, 5.75e-3], abs=1e-6)
    assert frontend.parse("off") is None and frontend.parse("fitted") is frontend.FITTED
    assert "4.00 ms a question" in fe.describe() and "0.250 us/token" in fe.describe()
    for bad in ("4,0.5", "x,1,1", "4,-1,0", "4,nan,0", "1,1,1,1,1,1"):
        with pytest.raises(ValueError):
            frontend.parse(bad)
    assert frontend.twin_choice("live") == "live"
    with pytest.raises(argparse.ArgumentTypeError):
        frontend.twin_choice("4,0.5")


def test_the_twins_branches_reach_its_scheduler_when_the_front_end_says():
    """Branch gaps (20 ms + tokens) longer than a box round: stock (free scans) selects each
    branch alone, at its question's arrival + the model's offset; latency still counts from the
    arrival."""
    from eval.costmodel import profile_cost
    from eval.twin import run_arm
    from eval.workload import workload

    segs = workload("synthetic", MODEL, regime="cold", order="forward", questions=1, rate=1.0)
    fe = FrontEnd(0.01, 0.02, 1e-6, "test")
    res = run_arm(segs, MODEL, "stock", cost=profile_cost("box", MODEL), front_end=fe)
    assert res.ok, res.error
    q = segs[0].questions[0]
    arrival = res.questions[0].arrival_s
    offsets = fe.offsets([len(b.input_ids) for b in q.branches])
    got = [res.requests[b.rid].first_selection_s - arrival for b in q.branches]
    assert got == pytest.approx(offsets, abs=1e-9)
    assert res.metrics["rounds"] == 4 * len(res.questions)
    assert res.questions[0].latency_s > offsets[-1]
    both = run_arm(segs, MODEL, "stock", front_end=fe, branch_spread_s=1e-3)
    assert not both.ok and "branch_spread_s 0" in both.error
    back = run_arm(segs, MODEL, "stock", cost=profile_cost("box", MODEL),
                   front_end=replace(fe, back_s=0.007))
    assert [q.latency_s for q in back.questions] == pytest.approx(
        [q.latency_s + 0.007 for q in res.questions], abs=1e-9)  # NOTE: the same schedule


def test_replay_takes_the_front_end_and_its_report_states_it(tmp_path, capsys):
    out = tmp_path / "r"
    rc = replay.main(["--workload", "synthetic", "--questions", "1", "--policies", "stock",
                      "--model", MODEL, "--profile", "box", "--front-end", "10,20,1",
                      "--out", str(out), "--no-progress"])
    assert rc == 0
    described = FrontEnd(0.01, 0.02, 1e-6, "given: 10,20,1").describe()
    assert json.loads((out / "summary.json").read_text())["config"]["front_end"] == described
    assert described in (out / "report.md").read_text()
    with pytest.raises(SystemExit):
        replay.main(["--workload", "synthetic", "--front-end", "fitted",
                     "--branch-spread-ms", "0.8", "--out", str(out)])
    assert "leave out --branch-spread-ms" in capsys.readouterr().err


def _run_dir(tmp_path, questions: int):
    d = tmp_path / f"arm-radixflow-{questions}"
    d.mkdir()
    records, events = _live(C, A, B, questions=questions)
    for name, rows in (("requests.jsonl", records), ("trace.jsonl", events)):
        (d / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def test_live_ab_fits_the_twins_front_end_on_its_own_radixflow_run(tmp_path):
    w = live_ab.Workload("paper", "paper mix")
    ref = RunRecord("paper", "radixflow", 0, 1, str(_run_dir(tmp_path, 30)))
    spread, fe, note = live_ab.client_arrivals(w, ref, argparse.Namespace(twin_front_end="live"))
    assert spread == 0.0 and (fe.c_s, fe.a_s, fe.b_s) == pytest.approx((C, A, B), rel=1e-6)
    assert note == f"; {fe.describe()}" and ref.dir in note
    spread, fe, note = live_ab.client_arrivals(w, ref, argparse.Namespace(twin_front_end="off"))
    assert fe is None and spread == pytest.approx(2e-4) and "0.20 ms apart" in note
    few = RunRecord("paper", "radixflow", 0, 1, str(_run_dir(tmp_path, 5)))
    spread, fe, _ = live_ab.client_arrivals(w, few, argparse.Namespace(twin_front_end="live"))
    assert fe is None and spread == pytest.approx(2e-4)  # NOTE: falls back to the spread


def test_run_arms_takes_the_front_end_and_records_it():
    args = run_arms.build_parser().parse_args(["--twin-front-end", "fitted", "--out", "x"])
    assert args.twin_front_end == "fitted"
    with pytest.raises(SystemExit):
        run_arms.build_parser().parse_args(["--twin-front-end", "1,2", "--out", "x"])
    assert frontend.for_twin("live", None) is None
    assert frontend.for_twin(args.twin_front_end, None) is frontend.FITTED
