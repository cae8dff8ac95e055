"""eval/replay.py --trace DIR: each non-stock arm's RadixFlow trace, as a server writes it."""

from __future__ import annotations

import json

from eval import replay


def test_replay_trace_writes_each_radixflow_arm(tmp_path):
    trace, out = tmp_path / "trace", tmp_path / "out"
    rc = replay.main(["--workload", "nsample", "--model", "qwen3.5-4b", "--policies",
                      "stock,radixflow", "--prompts", "1", "--n", "3", "--prompt-len", "1024",
                      "--output-len", "2", "--host-cost", "none", "--no-progress",
                      "--trace", str(trace), "--out", str(out)])
    assert rc == 0
    assert sorted(p.name for p in trace.iterdir()) == ["radixflow.jsonl"]  # NOTE: no stock
    events = [json.loads(line) for line in (trace / "radixflow.jsonl").open()]
    kinds = {e["event"] for e in events}
    assert {"round", "selected", "forward", "decide"} <= kinds
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["trace"] == str(trace)
    rounds = [e for e in events if e["event"] == "round"]
    # NOTE: the trace is the arm's: its rounds' tokens are the arm's scheduled tokens
    assert sum(e["scheduled_tokens"] for e in rounds) == \
        summary["arms"]["radixflow"]["scheduled_tokens"]
    # a second run starts a fresh file (the runtime appends)
    assert replay.main(["--workload", "nsample", "--model", "qwen3.5-4b", "--policies",
                        "radixflow", "--prompts", "1", "--n", "3", "--prompt-len", "1024",
                        "--output-len", "2", "--host-cost", "none", "--no-progress",
                        "--trace", str(trace), "--out", str(out)]) == 0
    assert len((trace / "radixflow.jsonl").read_text().splitlines()) == len(events)
