"""python -m radixflow_sglang.explain: a timeline for every request of a replay's trace."""

from __future__ import annotations

import io
import json

from eval import replay
from radixflow_sglang import explain


def test_explain_prints_a_timeline_for_every_request_of_a_replay_trace(tmp_path, capsys):
    trace, out = tmp_path / "trace", tmp_path / "out"
    assert replay.main(["--workload", "gsp", "--model", "qwen3.5-4b", "--policies",
                        "radixflow-always", "--groups", "3", "--prompts-per-group", "3",
                        "--host-cost", "none", "--no-progress", "--trace", str(trace),
                        "--out", str(out)]) == 0
    path = trace / "radixflow-always.jsonl"
    events = [json.loads(line) for line in path.open()]
    selected = {e["rid"] for e in events if e["event"] == "selected"}
    assert len(selected) == 9
    capsys.readouterr()
    assert explain.main([str(path)]) == 0
    text = capsys.readouterr().out
    heads = {line.split(":")[0] for line in text.splitlines() if not line.startswith(" ")}
    assert heads == selected
    # NOTE: the gsp siblings wait for their group's first: some request parked, by its rule
    assert "visit: park (always_wait)" in text and "parked: waits for" in text
    assert "admitted: resumes from depth" in text


def test_explain_one_request(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [{"event": "park", "round": 1, "rid": "a", "action": "park", "reason": "wait_wins"},
            {"event": "park", "round": 1, "rid": "b", "action": "native",
             "reason": "no_sharer"},
            {"event": "cut", "round": 2, "rid": "a", "placed": "marker", "reason": "cut_unpaid",
             "action": "native", "depth": None, "mark": 2112},
            {"event": "admitted", "round": 2, "rid": "a", "prefix": 2048, "hit": 2048,
             "extend": 120, "publish": None}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"event": "par')
    buf = io.StringIO()
    assert explain.explain(path, "a", buf) == 1
    text = buf.getvalue()
    assert text.splitlines()[0] == "a: first seen in round 1"
    assert "visit: park (wait_wins)" in text and "resumes from depth 2048" in text
    assert "publish: native (marker, cut_unpaid) at SGLang's own depth; fork mark 2112" in text
    assert "b:" not in text


def test_explain_prints_the_rulebook(capsys):
    from radixflow_sglang.core.reasons import RULEBOOK

    assert explain.main(["--rulebook"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line[2:3].isdigit()]
    assert len(rows) == len(RULEBOOK) and "`rows`" in rows[0]


def test_explain_piped_into_head_prints_no_traceback(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "t.jsonl"
    rows = ({"event": "park", "round": n, "rid": f"r{n}", "action": "native",
             "reason": "no_sharer"} for n in range(20_000))  # NOTE: past a pipe's buffer
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    p = subprocess.Popen([sys.executable, "-m", "radixflow_sglang.explain", str(path)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline().startswith(b"r0:")
    p.stdout.close()  # NOTE: what `head -1` does after its line
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0 and "Traceback" not in err and "BrokenPipe" not in err
