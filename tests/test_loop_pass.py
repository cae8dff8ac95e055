"""The scheduler loop's pass (issue 51, twin vs live on the box's sibling shape): live, the loop
scans again only some ms after a launch or a processed result (the launch call, the result's
processing and streaming, taking in requests), so under overlap a request that registers in that
pass is scanned while the round just launched runs, and stock admits it with a short hit. The
server traces the pass per scan (adapter/scheduler.py, `round` events' `pass_s`),
eval/calibrate.py `loop_pass` reads its median, and the twin's loop waits it out
(testing/loop.py `VirtualLoop.pass_s`)."""

from __future__ import annotations

import json

import pytest

from eval import calibrate, costmodel, twin
from eval.workload import Branch, Question, Segment

MODEL = "qwen3.5-0.8b"


def _siblings(gap_s: float) -> list[Segment]:
    """Two one-branch requests on one 2,048-token prefix, the second `gap_s` after the first
    (a group's later sibling: it shares the first's whole prompt but its last tokens)."""
    doc = list(range(1000, 3048))
    qs = [Question(f"s{i}", "g", (Branch(f"s{i}/A", doc + [20_000 + i] * 8, "g", 0),), 0, 0,
                   arrival_s=0.25 + i * gap_s) for i in range(2)]
    return [Segment("cold", "forward", tuple(qs))]


@pytest.mark.parametrize("overlap", [True, False])
def test_the_twins_next_scan_waits_out_the_loops_pass(overlap):
    cost = costmodel.CostModel(0.005, 2e-6, 1e-4)  # the box: a forward of ~9 ms here
    segs = _siblings(0.003)
    runs = {p: twin.replay(segs, MODEL, "stock", overlap=overlap, cost=cost, loop_pass_s=p)
            for p in (0.0, 0.005)}
    free, paced = runs[0.0], runs[0.005]
    (a0, b0), (a1, b1) = free.rounds, paced.rounds
    assert a0.scan_s == a1.scan_s == pytest.approx(0.25)
    if overlap:
        # NOTE: the first round is launched at its scan (free scans) and nothing was in flight:
        # the next pass comes 5 ms after the launch, while the first sibling still runs, and
        # the second (registered 3 ms after the first) is scanned then: stock recomputes it
        assert b1.scan_s == pytest.approx(a1.start_s + 0.005)
        assert b1.scan_s < a1.end_s and b1.hit_tokens < b0.hit_tokens
        # NOTE: without a pass the loop finds nothing, waits for the first round's result,
        # and the second sibling hits the first's whole prompt
        assert b0.scan_s == pytest.approx(a0.end_s) and b0.hit_tokens >= 2048 - 64
    else:
        # NOTE: the loop processes its own launch's result: the pass runs from its end
        assert b1.scan_s == pytest.approx(a1.end_s + 0.005)
        assert b0.scan_s == pytest.approx(a0.end_s)
        assert b1.hit_tokens == b0.hit_tokens  # the pass moved the round, not the hit


def test_loop_pass_is_the_median_of_the_traced_passes(tmp_path):
    events = [{"event": "round", "round": 1, "rows": 1, "pass_s": 0.004},
              {"event": "round", "round": 2, "rows": 1, "pass_s": None},  # not the first pass
              {"event": "forward", "round": 2, "pass_s": 9.0},  # no scan's
              {"event": "round", "round": 3, "rows": 2, "pass_s": 0.006},
              {"event": "round", "round": 4, "rows": 1},  # an older trace's
              {"event": "round", "round": 5, "rows": 1, "pass_s": 0.020}]
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    assert calibrate.loop_pass(path) == (pytest.approx(0.006), 3)
    assert calibrate.loop_pass(events[:2] + events[3:4]) == (pytest.approx(0.005), 2)
    assert calibrate.loop_pass(events[4:5]) is None
