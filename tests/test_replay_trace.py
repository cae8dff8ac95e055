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


def test_replay_undeclared_drops_the_declared_boundaries(tmp_path):
    """--undeclared: bench_serving's view (no boundary sent), as eval/live_ab.py's twin replays
    it: the radixflow arm places no `declared` boundary and computes what the twin computes on
    `eval.requests.undeclared` of the same workload; declared, it places them."""
    from eval.requests import undeclared
    from eval.twin import run_arm
    from eval.workload import workload
    from radixflow_sglang.config import RadixFlowConfig

    shape = dict(groups=3, prompts_per_group=3, system_len=512, question_len=64, output_len=2)

    def arm(flag: list[str]) -> tuple[set, dict]:
        trace, out = tmp_path / f"t{len(flag)}", tmp_path / f"o{len(flag)}"
        assert replay.main(["--workload", "gsp", "--model", "qwen3.5-0.8b", "--policies",
                            "radixflow", *[f"--{k.replace('_', '-')}={v}" for k, v in
                                           shape.items()],
                            "--layout", "no_buffer", "--host-cost", "none", "--no-progress",
                            "--trace", str(trace), "--out", str(out), *flag]) == 0
        events = [json.loads(line) for line in (trace / "radixflow.jsonl").open()]
        summary = json.loads((out / "summary.json").read_text())
        return {e["placed"] for e in events if e["event"] == "cut"}, summary

    placed, declared = arm([])
    assert "declared" in placed and declared["config"]["undeclared"] is False
    placed, plain = arm(["--undeclared"])
    assert "declared" not in placed and plain["config"]["undeclared"] is True
    twin = run_arm(undeclared(workload("gsp", "qwen3.5-0.8b", **shape)), "qwen3.5-0.8b",
                   "radixflow", layout="no_buffer", radixflow_config=RadixFlowConfig())
    tokens = plain["arms"]["radixflow"]["scheduled_tokens"]
    assert tokens == twin.metrics["scheduled_tokens"]
