"""Bad inputs get clear errors that name the problem, and nothing already accepted is lost.

Covers malformed workload files (eval.workload loaders: DataError names file and line),
unknown model and policy names, out-of-range flags and environment settings, prompts longer
than the context, empty prompts, and every request feature through a real server (logprobs,
grammars, n > 1, stop strings, LoRA names, hidden states, malformed custom_params: each works
or is a 400, and a concurrent well-formed client is served throughout). Where SGLang itself
rejects an input before its scheduler (the front door), the test pins SGLang's own message;
where the CPU kit hands an input straight to SGLang's scan, the test documents what the scan
does.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from array import array
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from eval import workload as wl
from radixflow_sglang.core.policy import POLICIES, policy_spec
from radixflow_sglang.geometry import load_geometry, model_names
from radixflow_sglang.testing.harness import VirtualClock

ROOT = Path(__file__).resolve().parents[1]
NO_LEAK = {"kv": 0, "rows": 0, "mamba": 0}


def race_row(example_id: str = "a1.txt", question: str = "Who?", answer: str = "A") -> dict:
    return {"example_id": example_id, "article": "Tom has a red kite.", "question": question,
            "options": ["Tom", "Ann", "Sue", "Bob"], "answer": answer}


def quality_row(instructions: list, outputs: list) -> dict:
    return {"input": "A long story.", "instructions": instructions, "outputs": outputs}


GOOD_Q = "Why did he go?\n\n (A) Food\n (B) Money\n (C) Love\n (D) None"


def write_lines(path: Path, lines: list) -> Path:
    text = [x if isinstance(x, str) else json.dumps(x) for x in lines]
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return path


def kit(policy: str = "stock", model: str = "qwen3.5-4b", **cfg: Any) -> Any:
    from radixflow_sglang.testing.kit import Kit, KitConfig

    clock = VirtualClock()
    return Kit(KitConfig(model=model, **cfg), policy=policy, clock=clock, sleep=clock.sleep)


def sglang_req(rid: str, ids: list[int]) -> Any:
    """A Req built as the kit builds one, without the kit's intake checks."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    sp = SamplingParams(max_new_tokens=1, ignore_eos=True)
    sp.normalize(None)
    return Req(rid, "", array("q", ids), sp, vocab_size=248_320)


def drain(k: Any, steps: int = 200) -> None:
    for _ in range(steps):
        s = k.sched
        if not (s.waiting_queue or s.chunked_req is not None or s.result_queue):
            return
        k.clock.now += 1e-3
        k.step()
    raise AssertionError(f"not drained: {[r.rid for r in k.sched.waiting_queue]} waiting")


# --- malformed workload files ----------------------------------------------------------------


@pytest.mark.parametrize("bad, message", [
    ("[1, 2, 3]", "expected a JSON object"),
    ('{"example_id": "x", "article": "a"', "malformed JSON"),
    ({**race_row(), "article": 5}, "field 'article' should be str"),
    ({k: v for k, v in race_row().items() if k != "example_id"}, "missing field 'example_id'"),
    ({**race_row(), "options": ["a", "b", "c", 4]}, "exactly 4 string options"),
    ({**race_row(), "answer": "a"}, "answer should be one of A-D"),
])
def test_race_file_errors_name_the_file_and_the_physical_line(tmp_path: Path, bad: str | dict,
                                                              message: str) -> None:
    # blank lines count: the broken record is on line 4 of the file
    path = write_lines(tmp_path / "test.jsonl", [race_row(), "", race_row("a2.txt"), bad])
    with pytest.raises(wl.DataError, match=message) as e:
        wl.load_race(path)
    assert f"{path} line 4:" in str(e.value)


@pytest.mark.parametrize("row, message", [
    (quality_row([GOOD_Q, GOOD_Q], ["(A)"]), "2 instructions but 1 outputs"),
    (quality_row([GOOD_Q], ["A) Food"]), r"question 1: output should start with '\(A\)'"),
    (quality_row([GOOD_Q, 7], ["(A)", "(B)"]), "question 2: instruction and output should be"),
    (quality_row(["\n\n (A) a\n (B) b\n (C) c\n (D) d"], ["(A)"]), "empty question text"),
    ({"instructions": [GOOD_Q], "outputs": ["(A)"]}, "missing field 'input'"),
])
def test_quality_file_errors_name_file_line_and_question(tmp_path: Path, row: dict,
                                                         message: str) -> None:
    path = write_lines(tmp_path / "leval_quality.jsonl", [quality_row([GOOD_Q], ["(B)"]), row])
    with pytest.raises(wl.DataError, match=message) as e:
        wl.load_quality(path)
    assert f"{path} line 2" in str(e.value)


def test_race_file_that_is_not_utf8_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "test.jsonl"
    path.write_bytes(json.dumps(race_row()).encode() + b"\n" + b'{"article": "\xff\xfe"}\n')
    with pytest.raises(wl.DataError, match="not UTF-8") as e:
        wl.load_race(path)
    assert f"{path} line 2: " in str(e.value)


def test_replay_cli_reports_a_malformed_workload_file_and_exits_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from eval import replay

    write_lines(tmp_path / "test.jsonl", [race_row(), {**race_row(), "answer": "Z"}])
    rc = replay.main(["--workload", "race", "--data-dir", str(tmp_path), "--questions", "1",
                      "--policies", "stock", "--out", str(tmp_path / "out"), "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "cannot build the workload" in err and f"{tmp_path / 'test.jsonl'} line 2" in err
    assert not (tmp_path / "out").exists()  # nothing was replayed or written


def test_workload_builder_rejects_a_branch_over_max_input_len(tmp_path: Path) -> None:
    write_lines(tmp_path / "test.jsonl", [race_row(), race_row("a2.txt")])
    qs = wl.load_questions("race", "qwen3.5-4b", data_dir=tmp_path)
    longest = max(n for q in qs for n in q.input_lens)
    with pytest.raises(ValueError, match=rf"{tmp_path / 'test.jsonl'} line 1 \(race-test:1\): "
                                         rf"branch [A-D] is {longest} tokens, over "
                                         rf"max_input_len={longest - 1}"):
        wl.load_questions("race", "qwen3.5-4b", data_dir=tmp_path, max_input_len=longest - 1)
    with pytest.raises(ValueError, match="over max_input_len=10; drop the record"):
        wl.workload("synthetic", questions=2, max_input_len=10)


# --- unknown model names -----------------------------------------------------------------------


def test_unknown_model_names_list_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'llama-70b': no config.json; known: ") \
            as e:
        load_geometry("llama-70b")
    for name in ("qwen3.5-4b", "nemotron-9b", "qwen3-8b"):
        assert name in model_names() and name in str(e.value)
    with pytest.raises(ValueError, match="unknown model 'llama-70b'"):
        kit(model="llama-70b")
    with pytest.raises(ValueError, match="unknown model 'llama-70b'; known: "):
        wl.get_tokenizer("llama-70b")
    from eval.costmodel import default_cost

    with pytest.raises(ValueError, match="no parameter count for 'llama-70b'"):
        default_cost("llama-70b")


@pytest.mark.parametrize("text, needle", [
    ("{", "malformed JSON"), ("{}", "missing or invalid model field 'num_hidden_layers'")],
    ids=["malformed", "incomplete"])
def test_a_broken_model_config_names_the_file(tmp_path: Path, text: str, needle: str) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(text)
    with pytest.raises(ValueError, match=needle) as e:
        load_geometry(tmp_path)
    assert str(e.value).startswith(f"{cfg}: ")


# --- unknown policy names ----------------------------------------------------------------------


def test_unknown_policy_names_list_the_choices() -> None:
    """The core's error is neutral; the config layer names what the caller set (here the
    RadixFlowConfig field; the flag or variable: tests/test_launch_server.py)."""
    choices = "(choose from " + ", ".join(POLICIES) + ")"
    with pytest.raises(ValueError) as e:
        policy_spec("nope")
    assert str(e.value) == f"invalid policy 'nope' {choices}"
    with pytest.raises(ValueError) as e:
        kit(policy="nope")
    assert str(e.value) == f"RadixFlowConfig.policy: invalid choice 'nope' {choices}"


def test_unknown_policy_is_a_failed_twin_arm_not_a_crash() -> None:
    from eval import twin

    res = twin.run_arm(twin.probe_segments(), "qwen3.5-4b", "nope")
    assert not res.ok and "'nope' (choose from stock," in res.error and res.metrics is None


def test_replay_cli_rejects_an_unknown_policy_with_exit_2() -> None:
    r = subprocess.run([sys.executable, "-m", "eval.replay", "--policies", "stock,nope"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "argument --policies: invalid choice: 'nope' (choose from stock," in r.stderr


# --- out-of-range flags and settings ---------------------------------------------------------


@pytest.mark.parametrize("value", ["5000", "-0.5", "nan", "inf"])
def test_launcher_rejects_admission_ms_out_of_range_naming_the_flag(value: str) -> None:
    r = subprocess.run([sys.executable, "-m", "radixflow_sglang.launch_server",
                        "--radixflow-admission-ms", value], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2
    assert "error: argument --radixflow-admission-ms:" in r.stderr
    assert "is outside the allowed range [0, 1000] ms" in r.stderr


@pytest.mark.parametrize("argv, needle", [
    (["--radixflow-theta", "1e9"], "--radixflow-theta: '1e9' is not an integer"),
    (["--radixflow-park-margin", "-1"],
     "--radixflow-park-margin: -1 is outside the allowed range [0, 1000]"),
    (["--radixflow-frag-cap", "-2"], "--radixflow-frag-cap: -2 is outside the allowed range"),
    (["--radixflow-theta", "2000000"], "--radixflow-theta: 2000000 is outside the allowed range "
                                       "[1, 1048576]"),
])
def test_launcher_rejects_other_out_of_range_flags(argv: list[str], needle: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from radixflow_sglang import launch_server as ls

    with pytest.raises(SystemExit) as e:
        ls.parse(argv, env={})
    assert e.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("ms", [5000.0, -1.0, float("nan")])
def test_policy_spec_rejects_admission_ms_out_of_range(ms: float) -> None:
    with pytest.raises(ValueError, match=r"^admission_ms .* is outside \[0, 1000\]$"):
        policy_spec("radixflow", admission_ms=ms)


@pytest.mark.parametrize("var, value", [
    ("RADIXFLOW_ADMISSION_MS", "5000"), ("RADIXFLOW_ADMISSION_MS", "nan"),
    ("RADIXFLOW_THETA", "abc"), ("RADIXFLOW_PARK_MARGIN", "-3"), ("RADIXFLOW_FRAG_CAP", "x"),
    ("RADIXFLOW_TRACE", "/no/such/dir/t.jsonl")])
def test_plugin_rejects_bad_settings_at_start_up_naming_the_variable(
        monkeypatch: pytest.MonkeyPatch, var: str, value: str) -> None:
    """With the plugin (RADIXFLOW_POLICY=... sglang serve) every RADIXFLOW_* setting is checked
    when the plugin registers, before a model loads, and the error names the variable."""
    import sglang.srt.managers.scheduler as m

    from radixflow_sglang import plugin
    from radixflow_sglang.adapter import entry

    monkeypatch.setenv("RADIXFLOW_POLICY", "radixflow")
    monkeypatch.setenv(var, value)
    try:
        with pytest.raises(SystemExit, match=f"^radixflow plugin: {var}: .*; not starting$"):
            plugin.register()
        assert m.Scheduler is entry._UPSTREAM_CLASS  # nothing was installed
    finally:
        m.Scheduler = entry._UPSTREAM_CLASS


def test_kit_rejects_an_unknown_layout() -> None:
    """A typo once silently built a no_buffer cache (enable_mamba_extra_buffer False)."""
    with pytest.raises(ValueError, match=r"KitConfig.layout: 'extra-buffer' \(choose from "
                                         r"extra_buffer, no_buffer\)"):
        kit(policy="traversal", layout="extra-buffer")


# --- prompts longer than the context ---------------------------------------------------------


def test_sglang_rejects_a_prompt_longer_than_the_context_before_its_scheduler() -> None:
    """What SGLang's scheduler does at intake (Scheduler.handle_generate_request):
    validate_input_length against max_req_input_len = min(context - 1, KV pool - 1) - 5."""
    from sglang.srt.managers.utils import validate_input_length

    req = sglang_req("long", list(range(1000, 1000 + 33_000)))
    msg = validate_input_length(req, 32_768 - 1 - 5, allow_auto_truncate=False)
    assert msg.startswith("Input length (33000 tokens) exceeds the maximum allowed length "
                          "(32762 tokens)")


@pytest.mark.parametrize("n, kv_tokens, limit", [(33_000, 400_000, 32_762),
                                              (7_000, 6_000, 5_994)],
                         ids=["over-context", "over-kv-pool"])
@pytest.mark.parametrize("policy", ["stock", "radixflow"])
def test_kit_rejects_an_overlong_prompt_and_keeps_the_accepted_ones(policy: str, n: int,
                                                                    kv_tokens: int,
                                                                    limit: int) -> None:
    """The kit checks at intake, as SGLang's front end does; before, the scan crashed with a
    tensor-size RuntimeError (over the context, losing the request batched with it) or the
    queue waited forever (over the KV pool)."""
    k = kit(policy, kv_tokens=kv_tokens)
    k.submit(k.req("good1", list(range(50_000, 50_300))))
    with pytest.raises(ValueError, match=rf"^request 'long': {n} input tokens exceed the limit "
                                         rf"{limit} \(context 32768, KV pool {kv_tokens} tokens\)"):
        k.submit(k.req("long", list(range(1000, 1000 + n))))
    k.submit(k.req("good2", list(range(60_000, 60_300))))
    drain(k)
    assert set(k.finished) == {"good1", "good2"} and k.leaks() == NO_LEAK


@pytest.mark.parametrize("n", [998, 999])
@pytest.mark.parametrize("model", ["qwen3.5-4b", "qwen3-8b"])
def test_a_prompt_the_kit_accepts_near_the_kv_pool_size_completes(model: str, n: int) -> None:
    k = kit(model=model, kv_tokens=1000)
    k.submit(k.req("good", list(range(50_000, 50_100))))
    try:
        k.submit(k.req("long", list(range(1000, 1000 + n))))
    except ValueError as e:
        assert "exceed the limit" in str(e)  # rejected at intake: fine
    drain(k)
    assert not k.sched.waiting_queue and k.leaks() == NO_LEAK


def test_the_longest_prompt_the_kit_accepts_completes() -> None:
    k = kit(kv_tokens=1000)  # SGLang's cap: min(context - 1, pool - 1) - 5 = 994
    with pytest.raises(ValueError, match="995 input tokens exceed the limit 994"):
        k.req("over", list(range(1000, 1995)))
    k.submit(k.req("good", list(range(50_000, 50_100))), k.req("long", list(range(1000, 1994))))
    drain(k)
    assert set(k.finished) == {"good", "long"} and k.leaks() == NO_LEAK


# --- empty prompts -----------------------------------------------------------------------------


def test_sglang_front_door_rejects_an_empty_prompt() -> None:
    from sglang.srt.managers.io_struct import GenerateReqInput

    with pytest.raises(ValueError, match=r"^input_ids cannot be empty\.$"):
        GenerateReqInput(input_ids=[], sampling_params={"max_new_tokens": 1}) \
            .normalize_batch_and_arguments()


@pytest.mark.parametrize("model", ["qwen3.5-4b", "qwen3-8b"])
def test_sglang_scan_admits_an_empty_prompt_and_its_result_path_asserts(model: str) -> None:
    """Documented, not endorsed: SGLang's scan itself takes an empty prompt as a row that
    extends 0 tokens; release_kv_cache then fails its holds_kv/is_kv_released assertion."""
    k = kit(model=model)
    k.sched.waiting_queue.extend([k.req("good", [5, 6, 7]), sglang_req("empty", [])])
    batch = k.scan()
    assert [(r.rid, r.prefix_len, r.extend_end) for r in batch.reqs] == [
        ("good", 0, 3), ("empty", 0, 0)]
    with pytest.raises(AssertionError):
        k.complete(batch)
    assert set(k.finished) == {"good"}  # rows after the empty one would never complete


@pytest.mark.parametrize("policy", ["stock", "radixflow"])
def test_kit_rejects_an_empty_prompt_and_keeps_the_accepted_ones(policy: str) -> None:
    """Before the intake check, the kit admitted it as a 0-token row, release_kv_cache
    asserted, and the rows batched after it were lost."""
    k = kit(policy)
    k.submit(k.req("good1", list(range(50_000, 50_300))))
    with pytest.raises(ValueError, match=r"^request 'empty': input_ids cannot be empty$"):
        k.submit(k.req("empty", []))
    k.submit(k.req("good2", list(range(60_000, 60_300))))
    drain(k)
    assert set(k.finished) == {"good1", "good2"} and k.leaks() == NO_LEAK


# --- aborts of what is not queued --------------------------------------------------------------


def test_aborting_a_request_that_is_not_queued_names_it_and_keeps_the_queue() -> None:
    """Once a bare StopIteration with an empty message."""
    k = kit("traversal")
    k.submit(k.req("a", list(range(100, 400))))
    with pytest.raises(KeyError, match="abort_waiting: request 'zzz' is not waiting"):
        k.abort_waiting("zzz")
    assert [r.rid for r in k.sched.waiting_queue] == ["a"]
    drain(k)
    with pytest.raises(KeyError, match="request 'a' is not waiting"):  # finished
        k.abort_waiting("a")
    assert set(k.finished) == {"a"} and k.leaks() == NO_LEAK


def test_aborting_queued_requests_loses_nothing_else() -> None:
    k = kit("radixflow")
    k.submit(*[k.req(f"r{i}", list(range(1000, 3000)) + [i, 7]) for i in range(4)])
    k.step()  # held by flexible admission (nothing running)
    k.abort_waiting("r1")
    drain(k)
    assert set(k.finished) == {"r0", "r2", "r3"} and k.leaks() == NO_LEAK


# --- request features through a real server (every executor: the simulated one here) ----------
# Each variant either works or is a 400 naming the field and the executor; none may reach a
# path that kills the scheduler (a logprob request once did: copy_to_cpu read a None
# logits_output), and a well-formed client served meanwhile is never harmed.

LOG_HALF = math.log(0.5)  # the chosen token's logprob (adapter/sim_outputs.py)
BOOL_SCHEMA = json.dumps({"type": "object", "properties": {"a": {"type": "boolean"}},
                          "required": ["a"], "additionalProperties": False})


@pytest.fixture(scope="module", params=["stock", "radixflow"])
def feature_server(request, tmp_path_factory):
    from radixflow_sglang.testing.server import Server, free_port, strict_launcher

    tmp = tmp_path_factory.mktemp(f"features-{request.param}")
    port = free_port()
    cmd, env = strict_launcher(request.param, port)
    with Server(cmd, env, tmp / "server.log", port, cwd=ROOT) as srv:
        srv.wait_ready(600)  # NOTE: a hang bound
        yield srv


def post(base: str, path: str, body: dict) -> tuple[int, Any]:
    req = urllib.request.Request(base + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        raw = e.read().decode(errors="replace")
        try:
            return e.code, json.loads(raw)
        except json.JSONDecodeError:
            return e.code, raw


def gen(text: str = "Hello", new: int = 1, **fields: Any) -> dict:
    sp = {"max_new_tokens": new, **fields.pop("sp", {})}
    return {"text": text, "sampling_params": sp, **fields}


def check_logprob(body: Any) -> None:
    mi = body["meta_info"]
    assert [(lp, tok) for lp, tok, _ in mi["output_token_logprobs"]] == \
        [(pytest.approx(LOG_HALF), t) for t in body["output_ids"]]


def check_top(body: Any) -> None:
    for (_, tok, _), top in zip(body["meta_info"]["output_token_logprobs"],
                                body["meta_info"]["output_top_logprobs"], strict=True):
        assert len(top) == 3 and top[0][1] == tok  # the chosen token heads the top-k
        assert [x[0] for x in top] == sorted((x[0] for x in top), reverse=True)


def check_token_ids(body: Any) -> None:
    rows = body["meta_info"]["output_token_ids_logprobs"]
    assert len(rows) == 2 and all([x[1] for x in row] == [5, 7] for row in rows)
    assert all(x[0] < LOG_HALF for row in rows for x in row)


def check_input_logprobs(body: Any) -> None:
    n = body["meta_info"]["prompt_tokens"]
    assert len(body["meta_info"]["input_token_logprobs"]) == n > 1
    assert len(body["meta_info"]["input_top_logprobs"]) == n


def check_regex(body: Any) -> None:
    assert re.fullmatch(r"[a-c]+", body["text"]), body["text"]


def check_schema(body: Any) -> None:
    assert json.loads(body["text"]) in ({"a": True}, {"a": False}), body["text"]


def check_n(body: Any) -> None:
    assert len(body) == 3 and all(len(b["output_ids"]) == 2 for b in body)


def check_openai_logprobs(body: Any) -> None:
    lp = body["choices"][0]["logprobs"]
    assert lp["token_logprobs"] == [pytest.approx(LOG_HALF)] * 2


def check_chat_logprobs(body: Any) -> None:
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 2 and all(len(c["top_logprobs"]) == 2 for c in content)


def check_json_object(body: Any) -> None:
    assert body["choices"][0]["message"]["content"].startswith("{")


WORKS = [  # (name, path, body, check)
    ("logprob", "/generate", gen(new=3, return_logprob=True), check_logprob),
    ("top logprobs", "/generate", gen(new=3, return_logprob=True, top_logprobs_num=3), check_top),
    ("token-id logprobs", "/generate", gen(new=2, return_logprob=True, token_ids_logprob=[5, 7]),
     check_token_ids),
    ("prompt logprobs", "/generate", gen("Hello world, this is", return_logprob=True,
                                         logprob_start_len=0, top_logprobs_num=2),
     check_input_logprobs),
    ("regex", "/generate", gen(new=8, sp={"regex": "[a-c]+"}), check_regex),
    ("json_schema", "/generate", gen(new=40, sp={"json_schema": BOOL_SCHEMA}), check_schema),
    ("n > 1", "/generate", gen(new=2, sp={"n": 3}), check_n),
    ("completions logprobs", "/v1/completions",
     {"model": "default", "prompt": "Hello", "max_tokens": 2, "logprobs": 1},
     check_openai_logprobs),
    ("completions echo logprobs", "/v1/completions",
     {"model": "default", "prompt": "Hello you", "max_tokens": 2, "logprobs": 1, "echo": True},
     lambda b: len(b["choices"][0]["logprobs"]["token_logprobs"]) == 4),
    ("chat top logprobs", "/v1/chat/completions",
     {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
      "logprobs": True, "top_logprobs": 2}, check_chat_logprobs),
    ("chat json_object", "/v1/chat/completions",
     {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
      "response_format": {"type": "json_object"}}, check_json_object),
]
REFUSED = [  # (name, path, body, what the 400 names)
    ("hidden states", "/generate", gen(return_hidden_states=True),
     "return_hidden_states: not supported by the simulated executor"),
    ("LoRA name", "/generate", gen(lora_path="my-adapter"), "LoRA adapter 'my-adapter'"),
    ("completions LoRA", "/v1/completions",
     {"model": "default:my-adapter", "prompt": "Hello", "max_tokens": 1}, "my-adapter"),
    ("custom_params text", "/generate", gen(sp={"custom_params": "abc"}),
     "sampling_params.custom_params: 'abc' is not an object"),
    ("custom_params list", "/generate", gen(sp={"custom_params": [1, 2]}),
     "sampling_params.custom_params: [1, 2] is not an object"),
    ("completions custom_params list", "/v1/completions",
     {"model": "default", "prompt": "Hello", "max_tokens": 1, "custom_params": [1, 2]},
     "custom_params"),
    ("boundary 10^30", "/generate", gen(sp={"custom_params": {"radixflow_boundary": 10 ** 30}}),
     "sampling_params.custom_params.radixflow_boundary: 1e+30 is outside [0, 1]"),
]


def stop_string_case(base: str) -> tuple[dict, str]:
    """A stop string taken from the executor's own (deterministic) output."""
    status, body = post(base, "/generate", gen(new=6, sp={"ignore_eos": True},
                                               return_logprob=True, return_text_in_logprobs=True))
    assert status == 200, body
    stop = body["meta_info"]["output_token_logprobs"][3][2]  # the 4th token's text
    assert stop and stop in body["text"], body
    return gen(new=6, sp={"ignore_eos": True, "stop": [stop]}), stop


@pytest.mark.slow
def test_every_request_feature_works_or_is_refused_and_others_are_served(feature_server):
    base = feature_server.base
    stop_body, stop = stop_string_case(base)
    good = {"input_ids": list(range(1000, 1300)),
            "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
    done = threading.Event()

    def good_client() -> list[tuple[int, Any]]:
        out = []
        while not done.is_set() or not out:
            out.append(post(base, "/generate", good))
        return out

    cases = [(n, p, b) for n, p, b, _ in WORKS + REFUSED] + [("stop", "/generate", stop_body)]
    with ThreadPoolExecutor(4) as ex:
        steady = ex.submit(good_client)
        answers = list(ex.map(lambda c: post(base, c[1], c[2]), cases))
        done.set()
        goods = steady.result()
    feature_server.check_alive("after every request feature")
    for (name, _, _, check), (status, body) in zip(WORKS, answers, strict=False):
        assert status == 200, (name, status, body)
        assert check(body) is not False, (name, body)
    for (name, _, _, needle), (status, body) in zip(REFUSED, answers[len(WORKS):],
                                                     strict=False):
        assert status == 400 and needle in json.dumps(body), (name, status, body)
    status, body = answers[-1]
    assert status == 200 and body["meta_info"]["finish_reason"] == {"type": "stop",
                                                                     "matched": stop}, body
    assert goods and all(s == 200 and len(b["output_ids"]) == 4 for s, b in goods), goods
    feature_server.idle_leak_check()
