"""Trace replay (issue 36, eval/mooncake.py): a Mooncake-format file as a workload of eval.replay,
eval.sweep and eval.run_arms. Every trace here is written by the test (no /work/shared)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eval import mooncake, replay, run_arms, sweep
from eval.twin import lcp
from eval.workload import DataError, workload

MODEL = "qwen3.5-0.8b"
B = mooncake.BLOCK

# (timestamp ms, input_length, output_length, hash_ids)
RECORDS = [
    (0, 2 * B + 300, 3, [1, 2, 3]),
    (500, 3 * B, 300, [1, 2, 4]),
    (1500, B + 88, 2, [1, 5]),
    (2000, 10, 1, [7]),
    (4000, 5 * B, 2, [1, 2, 3, 8, 9]),  # over the test's --trace-max-input
]


def write_trace(path: Path, records=RECORDS, extra: list[str] = ()) -> Path:
    lines = [json.dumps({"timestamp": t, "input_length": n, "output_length": o, "hash_ids": h})
             for t, n, o, h in records]
    path.write_text("\n".join([*lines, *extra]) + "\n")
    return path


def prompts(spec: mooncake.TraceSpec) -> list[list[int]]:
    return [q.branches[0].input_ids for q in mooncake.segments(spec, MODEL)[0]]


def test_requests_share_exactly_the_blocks_the_trace_says(tmp_path):
    ids = prompts(mooncake.TraceSpec(str(write_trace(tmp_path / "t.jsonl"))))
    assert [len(p) for p in ids] == [n for _, n, _, _ in RECORDS]
    want = {(0, 1): 2 * B, (0, 2): B, (1, 2): B, (0, 4): 2 * B + 300, (1, 4): 2 * B,
            (2, 4): B}
    for i in range(len(ids)):
        for j in range(i + 1, len(ids)):
            assert lcp(ids[i], ids[j]) == want.get((i, j), 0), (i, j)
    # NOTE: the same id is the same block in any build; distinct ids differ at their first id
    assert mooncake.block(2) == ids[1][B:2 * B] == mooncake.Blocks()(2)
    assert mooncake.block(3)[0] != mooncake.block(4)[0]
    lo, hi = mooncake.LO, mooncake.HI
    assert all(lo <= t < hi for p in ids for t in p)


def test_window_speed_and_caps(tmp_path):
    f = str(write_trace(tmp_path / "t.jsonl"))
    spec = mooncake.TraceSpec(f, speed=2.0, start=1, count=4, max_input=3 * B, max_output=100)
    seg = mooncake.segments(spec, MODEL)[0]
    assert [q.qid for q in seg] == ["l2", "l3", "l4"]  # line 5 is over --trace-max-input
    assert [q.arrival_s for q in seg] == [0.0, 0.5, 0.75]  # (ts - 500) / 1000 / 2
    assert [q.branches[0].max_new_tokens for q in seg] == [100, 2, 1]
    assert len({q.namespace for q in seg}) == 1
    d = mooncake.describe(spec)
    assert (d["window_records"], d["requests"], d["left_out_over_max_input"],
            d["outputs_capped"]) == (4, 3, 1, 1)
    # the sweep's rate: arrivals scaled to that mean rate over the window
    at = workload("trace", MODEL, rate=4.0, trace=spec)[0]
    assert [q.arrival_s for q in at] == pytest.approx([0.0, 1 / 3, 0.5])  # 2 gaps in 0.5 s
    assert mooncake.parse_window("2:") == (2, None)
    with pytest.raises(ValueError, match="--trace-window must be START:N"):
        mooncake.parse_window("3")
    with pytest.raises(ValueError, match="--trace-window starts at record 9"):
        mooncake.segments(mooncake.TraceSpec(f, start=9), MODEL)


@pytest.mark.parametrize("line, message", [
    ('{"timestamp": 9000, "input_length": 600, "output_length": 1}', "field 'hash_ids'"),
    ('{"timestamp": 9000, "input_length": 600, "output_length": 1, "hash_ids": [1]}',
     "1 hash_ids for input_length 600; expected ceil(600 / 512) = 2"),
    ('{"timestamp": -1, "input_length": 6, "output_length": 1, "hash_ids": [1]}',
     "field 'timestamp' must be a number >= 0"),
    ('{"timestamp": 9000, "input_length": 0, "output_length": 1, "hash_ids": []}',
     "field 'input_length' must be an integer >= 1"),
    ('{"timestamp": 9000, "input_length": 6, "output_length": 1.5, "hash_ids": [1]}',
     "field 'output_length' must be an integer >= 0"),
    ('{"timestamp": 10, "input_length": 6, "output_length": 1, "hash_ids": [1]}',
     "timestamp 10 ms is earlier than line 5's 4000 ms"),
    ('{"timestamp": 9000,', "malformed JSON"),
])
def test_a_bad_record_names_the_file_and_its_line(tmp_path, line, message):
    f = write_trace(tmp_path / "bad.jsonl", extra=[line])
    with pytest.raises(DataError) as e:
        mooncake.load_trace(f)
    assert f"{f} line 6: " in str(e.value) and message in str(e.value)


@pytest.mark.parametrize("argv, message", [
    (["--workload", "trace"], "--workload trace needs --trace-file FILE"),
    (["--workload", "gsp", "--trace-speed", "2"], "--trace-speed applies to --workload trace"),
    (["--workload", "trace", "--trace-file", "F", "--rate", "3"], "--rate does not apply"),
    (["--workload", "trace", "--trace-file", "F", "--groups", "3"], "--groups does not apply"),
    (["--workload", "trace", "--trace-file", "F", "--questions", "3"], "--questions applies"),
    (["--workload", "trace", "--trace-file", "F", "--trace-window", "x"], "--trace-window must"),
    (["--workload", "trace", "--trace-file", "F", "--trace-speed", "0"],
     "argument --trace-speed: must be > 0"),
    (["--workload", "trace", "--trace-file", "F", "--trace-max-input", "32700"],
     "--trace-max-input + --trace-max-output = 32956, over the context length"),
])
def test_cli_errors_name_the_flag(argv, message, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        replay.main([*argv, "--out", str(tmp_path / "x")])
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_a_missing_file_is_an_error_naming_it(tmp_path, capsys):
    rc = replay.main(["--workload", "trace", "--trace-file", str(tmp_path / "none.jsonl"),
                      "--out", str(tmp_path / "x")])
    assert rc == 2 and "--trace-file: no such file" in capsys.readouterr().err


def test_twin_replays_a_trace_under_stock_and_radixflow(tmp_path):
    f = write_trace(tmp_path / "t.jsonl")
    out = tmp_path / "out"
    rc = replay.main(["--workload", "trace", "--trace-file", str(f), "--trace-speed", "10",
                      "--trace-max-input", str(3 * B), "--trace-max-output", "4", "--model",
                      MODEL, "--policies", "stock,radixflow", "--out", str(out),
                      "--no-progress"])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["trace_workload"]["requests"] == 4
    inputs = sum(n for _, n, _, _ in RECORDS[:4])
    for arm in ("stock", "radixflow"):
        m = summary["arms"][arm]
        assert m["requests"] == 4 and m["input_tokens"] == inputs, arm
        assert m["output_tokens"] == 3 + 4 + 2 + 1, arm
        assert m["scheduled_tokens"] + m["hit_tokens"] == inputs, arm


def test_sweep_and_run_arms_take_the_trace_flags(tmp_path, capsys):
    f = str(write_trace(tmp_path / "t.jsonl"))
    p = sweep.build_parser()
    args = p.parse_args(["--out", "x", "--workload", "trace", "--trace-file", f,
                         "--trace-window", "0:4"])
    setup, _, _ = sweep.setup_from(args, sweep._trace(p, args))
    assert [q.arrival_s for q in sweep.segments_at(setup, 3.0)[0]] == [0.0, 0.25, 0.75, 1.0]
    with pytest.raises(SystemExit):
        p.parse_args(["--out", "x", "--trace-speed", "2"])  # NOTE: the sweep's --rates pace it
    p = run_arms.build_parser()
    args = p.parse_args(["--out", "x", "--workload", "trace", "--trace-file", f])
    run_arms.check_args(p, args)
    assert args.fork_arm is False and args.trace_spec.file == f
    assert len(run_arms.build_segments(args, {})[0]) == len(RECORDS)


class _Tok:
    """A tokenizer stand-in: one id per whitespace-separated word, no chat template."""

    def apply_chat_template(self, *a, **kw):
        raise ValueError("no template")

    def encode(self, text: str) -> list[int]:
        return [1000 + sum(map(ord, w)) % 5000 for w in text.split()]


def test_bench_segments_rebuild_bench_servings_prompts_and_pace(tmp_path):
    """eval/bench_arm.py mooncake's twin: bench_serving's own text per block, the first N
    records, arrivals / speed, outputs uncapped; a window start is refused."""
    f = str(write_trace(tmp_path / "t.jsonl"))
    seg = mooncake.bench_segments(mooncake.TraceSpec(f, speed=2.0, count=3), _Tok())[0]
    assert [q.qid for q in seg] == ["l1", "l2", "l3"]
    assert [q.arrival_s for q in seg] == [0.0, 0.25, 0.75]
    assert [q.branches[0].max_new_tokens for q in seg] == [3, 300, 2]  # NOTE: not capped
    ids = [q.branches[0].input_ids for q in seg]
    # "user: Round 1: 1hi hi ... 2hi ..." : one word per "hi", the ids joined at block edges
    assert len(ids[0]) == len(ids[1]) and lcp(ids[0], ids[1]) > 128
    assert lcp(ids[0], ids[2]) < lcp(ids[0], ids[1])
    with pytest.raises(ValueError, match="window start 1"):
        mooncake.bench_segments(mooncake.TraceSpec(f, start=1), _Tok())
