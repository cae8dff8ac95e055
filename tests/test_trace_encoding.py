"""The decision trace's encoding (adapter/trace.py): standard JSON, one event a line, the
same values `json.dumps(default=str)` wrote except non-finite numbers (null, not Infinity)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from radixflow_sglang.adapter.trace import Trace
from radixflow_sglang.core.reasons import Action, Reason


def test_events_read_back_as_the_values_emitted(tmp_path):
    path = tmp_path / "t.jsonl"
    t = Trace(str(path))
    t.emit({"event": "park", "round": 3, "rid": "r1", "action": Action.PARK,
            "reason": Reason.WAIT_WINS, "fork": True, "ready": None})
    t.emit({"event": "decide", "wait_s": 0.16177637727976174, "hits": (1, 2),
            "by_depth": {1024: 2}, "np": np.float64(0.25), "n": np.int64(7),
            "older_by": math.inf, "period_s": math.nan, "path": Path("/tmp/x")})
    t.flush()
    lines = path.read_bytes().splitlines()
    assert len(lines) == 2
    park, decide = (json.loads(x) for x in lines)
    assert park == {"event": "park", "round": 3, "rid": "r1", "action": "park",
                    "reason": "wait_wins", "fork": True, "ready": None}
    assert decide["wait_s"] == 0.16177637727976174 and decide["hits"] == [1, 2]
    assert decide["by_depth"] == {"1024": 2} and decide["np"] == 0.25 and decide["n"] == 7
    assert decide["older_by"] is None and decide["period_s"] is None  # NOTE: nor NaN
    assert decide["path"] == "/tmp/x"  # NOTE: anything else as its str()


def test_a_dp_rank_is_stamped_first_and_appends_to_one_file(tmp_path):
    path = tmp_path / "t.jsonl"
    for rank in (0, 1):
        t = Trace(str(path))
        t.dp_rank = rank
        t.emit({"event": "round", "round": 1})
        t.flush()
    assert [json.loads(x) for x in path.read_text().splitlines()] == [
        {"dp_rank": 0, "event": "round", "round": 1}, {"dp_rank": 1, "event": "round", "round": 1}]
