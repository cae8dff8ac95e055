"""Bad requests get a 400 before SGLang's scheduler sees them (adapter/validate.py), under every
policy, and the server keeps serving everyone else.

Fast: the check itself on SGLang's real request objects. Slow: one real server per policy
(`python -m radixflow_sglang.launch_server`, simulated executor) taking every bad input, then
good ones; before the patch an empty prompt killed the scheduler (release_kv_cache's assertion).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from radixflow_sglang import models

ROOT = Path(__file__).resolve().parents[1]
VOCAB = json.loads((models.model_dir(models.DEFAULT) / "config.json").read_text())[
    "text_config"]["vocab_size"]


def sub_requests(**fields: Any) -> list:
    """What TokenizerManager._validate_one_request receives: normalized (sub-)requests."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    obj = GenerateReqInput(sampling_params={"max_new_tokens": 1}, **fields)
    obj.normalize_batch_and_arguments()
    return [obj] if obj.is_single else [obj[i] for i in range(obj.batch_size)]


def problem(obj: Any, ids: list[int] | None) -> str | None:
    from radixflow_sglang.adapter.validate import token_input_problem

    return token_input_problem(obj, ids, VOCAB)


# --- the check, on SGLang's request objects ------------------------------------------------------


def test_an_empty_token_input_is_rejected_whatever_produced_it() -> None:
    [text] = sub_requests(text="")
    assert problem(text, []) == "the token input is empty (text gives no tokens); " \
                                "send at least one token"
    good, empty = sub_requests(input_ids=[[5, 6], []])
    assert problem(good, good.input_ids) is None
    assert "input_ids gives no tokens" in problem(empty, empty.input_ids)


def test_a_session_request_may_arrive_empty() -> None:
    """Upstream rebuilds a session prompt in the scheduler and rejects it there if still empty."""
    [obj] = sub_requests(input_ids=[], session_params={"id": "s1"})
    assert problem(obj, []) is None


@pytest.mark.parametrize("ids, tok, pos", [([1, 2, -1], -1, 2), ([VOCAB, 0], VOCAB, 0),
                                           ([0, VOCAB - 1, 2**40], 2**40, 2)])
def test_a_token_id_outside_the_vocabulary_is_named_with_the_size(ids: list[int], tok: int,
                                                                  pos: int) -> None:
    [obj] = sub_requests(input_ids=ids)
    assert problem(obj, ids) == (f"token id {tok} at position {pos} is outside the vocabulary "
                                 f"[0, {VOCAB}) (vocabulary size {VOCAB})")
    edge = [0, VOCAB - 1]
    assert problem(sub_requests(input_ids=edge)[0], edge) is None


def test_the_error_names_the_request_and_is_a_value_error() -> None:
    """ValueError is what SGLang's HTTP layer turns into a 400."""
    from radixflow_sglang.adapter.validate import check_token_input

    [obj] = sub_requests(input_ids=[-3], rid="mine")
    with pytest.raises(ValueError, match=r"^request 'mine': token id -3 at position 0 "):
        check_token_input(obj, obj.input_ids, VOCAB)


@pytest.mark.parametrize("fields, named", [
    ({"return_hidden_states": True}, "return_hidden_states"),
    ({"lora_path": "adapter"}, "lora_path"),
    ({"return_sampling_mask": True}, "return_sampling_mask"),
    ({"sampling_params": {"max_new_tokens": 1, "beam_width": 2}}, "sampling_params.beam_width"),
])
def test_the_simulated_executor_refuses_what_it_cannot_produce(fields: dict, named: str) -> None:
    from sglang.srt.managers.io_struct import GenerateReqInput

    from radixflow_sglang.adapter.validate import executor_problem

    obj = GenerateReqInput(input_ids=[5, 6], **{"sampling_params": {"max_new_tokens": 1},
                                                 **fields})
    obj.normalize_batch_and_arguments()
    msg = executor_problem(obj, "simulated")
    assert msg.startswith(f"{named}: not supported by the simulated executor "
                          "(--radixflow-executor simulated: ")
    assert executor_problem(obj, None) is None  # SGLang's model worker: SGLang decides
    plain = GenerateReqInput(input_ids=[5, 6], return_logprob=True, top_logprobs_num=2,
                             sampling_params={"max_new_tokens": 1, "regex": "[a-c]+", "n": 2})
    plain.normalize_batch_and_arguments()
    assert all(executor_problem(plain[i], "simulated") is None for i in range(2))


def test_install_wraps_upstream_validation_idempotently() -> None:
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    from radixflow_sglang.adapter import validate

    before = TokenizerManager._validate_one_request
    try:
        validate.install()
        validate.install()
        assert validate.installed()
        assert validate._UPSTREAM_VALIDATE.__qualname__ == \
            "TokenizerManager._validate_one_request"
    finally:
        TokenizerManager._validate_one_request = before


def _tokenizer_manager() -> Any:
    """What our checks read off the TokenizerManager (they fail before upstream's own run)."""
    from types import SimpleNamespace

    return SimpleNamespace(model_config=SimpleNamespace(vocab_size=VOCAB))


def test_top_logprobs_above_the_vocabulary_is_refused_naming_the_field_and_limit() -> None:
    from radixflow_sglang.adapter import validate

    validate.install()
    [obj] = sub_requests(input_ids=[5, 6], return_logprob=True, top_logprobs_num=10**6)
    with pytest.raises(ValueError) as e:
        validate._validate_one_request(_tokenizer_manager(), obj, [5, 6])
    assert str(e.value) == (f"top_logprobs_num: 1000000 is above the vocabulary size {VOCAB}; "
                            f"allowed: an integer in [0, {VOCAB}]")
    [edge] = sub_requests(input_ids=[5, 6], return_logprob=True, top_logprobs_num=VOCAB)
    assert validate.top_logprobs_problem(edge, VOCAB) is None


@pytest.mark.parametrize("fields, needle", [
    ({"input_ids": [[5, 6], [7, 8], [9, VOCAB]]},
     rf"^batch item 2: request '\w+': token id {VOCAB} at position 1 "),
    ({"text": ["Hello", ""]}, r"^batch item 1: request '\w+': the token input is empty"),
    ({"input_ids": [[5, 6], [7, 8]], "return_logprob": True, "top_logprobs_num": [1, 10**6]},
     r"^batch item 1: top_logprobs_num: 1000000 "),
])
def test_a_batch_items_check_failure_names_its_index(fields: dict, needle: str) -> None:
    from radixflow_sglang.adapter import validate

    validate.install()
    items = sub_requests(**fields)
    bad = items[-1]
    ids = bad.input_ids if bad.input_ids is not None else []
    with pytest.raises(ValueError, match=needle):
        validate._validate_one_request(_tokenizer_manager(), bad, ids)
    [single] = sub_requests(input_ids=[7, VOCAB])  # NOTE: not a batch: no index
    with pytest.raises(ValueError, match=r"^request '.*': token id "):
        validate._validate_one_request(_tokenizer_manager(), single, single.input_ids)


# --- a real server per policy ----------------------------------------------------------------


def post(url: str, body: dict, timeout: float = 120) -> tuple[int, Any]:
    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw = r.read()
            status = r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    text = raw.decode(errors="replace")
    try:
        return status, json.loads(text)
    except json.JSONDecodeError:
        return status, text


def error_text(body: Any) -> str:
    return json.dumps(body)


@pytest.fixture(scope="module", params=["stock", "radixflow"])
def server(request, tmp_path_factory):
    from radixflow_sglang.testing.server import Server, free_port, strict_launcher

    tmp = tmp_path_factory.mktemp(f"validate-{request.param}")
    port = free_port()
    cmd, env = strict_launcher(request.param, port)
    with Server(cmd, env, tmp / "server.log", port, cwd=ROOT) as srv:
        srv.wait_ready(400)
        yield srv


BAD = [
    ("empty text", {"text": ""}, "the token input is empty (text gives no tokens)"),
    ("empty ids", {"input_ids": []}, "input_ids cannot be empty"),  # upstream's own check
    ("empty item of a batch", {"input_ids": [[5, 6, 7], []]}, "input_ids gives no tokens"),
    ("empty text in a batch", {"text": ["Hello", ""]}, "text gives no tokens"),
    ("negative id", {"input_ids": [5, -1]}, f"token id -1 at position 1 is outside the "
                                            f"vocabulary [0, {VOCAB}) (vocabulary size {VOCAB})"),
    ("id = vocab", {"input_ids": [VOCAB, 5]}, f"token id {VOCAB} at position 0"),
    ("bad id in a batch", {"input_ids": [[5, 6], [7, VOCAB + 9]]}, f"token id {VOCAB + 9}"),
    ("its index", {"input_ids": [[5, 6], [7, VOCAB + 9]]}, "batch item 1: request '"),
    ("top-k above the vocabulary", {"input_ids": [5, 6], "return_logprob": True,
                                    "top_logprobs_num": 10**6},
     f"top_logprobs_num: 1000000 is above the vocabulary size {VOCAB}; allowed: an integer in "
     f"[0, {VOCAB}]"),
]


@pytest.mark.slow
def test_bad_requests_get_a_400_and_the_server_serves_everyone_else(server) -> None:
    good = {"input_ids": list(range(1000, 1300)),
            "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}

    def bad(case: tuple) -> tuple[int, Any]:
        return post(server.base + "/generate",
                    {**case[1], "sampling_params": {"max_new_tokens": 1}})

    with ThreadPoolExecutor(4) as ex:  # bad and good requests interleaved
        goods = [ex.submit(post, server.base + "/generate", good) for _ in range(3)]
        bads = list(ex.map(bad, BAD))
        goods = [g.result() for g in goods]
    for (name, _, needle), (status, body) in zip(BAD, bads, strict=True):
        assert status == 400, (name, status, body)
        assert needle in error_text(body), (name, body)
    for status, body in goods:
        assert status == 200 and len(body["output_ids"]) == 2
    server.check_alive("after the bad requests")
    status, body = post(server.base + "/generate", good)
    assert status == 200 and body["meta_info"]["prompt_tokens"] == 300
    server.idle_leak_check()


@pytest.mark.slow
def test_a_streamed_or_openai_bad_prompt_is_an_error_not_a_crash(server) -> None:
    req = urllib.request.Request(
        server.base + "/generate", json.dumps({"text": "", "stream": True,
                                               "sampling_params": {"max_new_tokens": 1}}).encode(),
        {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        events = [json.loads(x.removeprefix("data: ")) for x in r.read().decode().splitlines()
                  if x.startswith("data: {")]
    [err] = [e["error"] for e in events if "error" in e]
    assert err["code"] == 400 and "the token input is empty" in err["message"]
    status, body = post(server.base + "/v1/completions",  # token-id prompt: our check
                        {"model": "default", "prompt": [5, VOCAB], "max_tokens": 1})
    assert status == 400 and f"token id {VOCAB} at position 1" in error_text(body), body
    status, body = post(server.base + "/v1/completions",  # upstream's own check
                        {"model": "default", "prompt": "", "max_tokens": 1})
    assert status == 400, body
    server.check_alive("after the streamed and OpenAI bad prompts")
    status, body = post(server.base + "/v1/completions",
                        {"model": "default", "prompt": "Hello", "max_tokens": 1})
    assert status == 200, body


@pytest.mark.slow
def test_the_readme_curl_example_works(server) -> None:
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"`(curl [^`]*localhost:30000/generate[^`]*)`", readme)
    assert m, "README has no /generate curl example"
    cmd = shlex.split(m.group(1).replace("\n", " ").replace("localhost:30000",
                                                             server.base.removeprefix("http://")))
    out = subprocess.run(cmd + ["-s", "-w", "\n%{http_code}"], capture_output=True, text=True,
                         timeout=120)
    body, _, code = out.stdout.rpartition("\n")
    assert code == "200", out.stdout
    assert len(json.loads(body)["output_ids"]) == 1


@pytest.mark.slow
def test_the_launcher_logs_once_that_radixflow_is_active_and_with_which_policy(server) -> None:
    policy = server.cmd[server.cmd.index("--radixflow-policy") + 1]
    lines = [x for x in server.log.read_text().splitlines() if "RadixFlow active" in x]
    assert len(lines) == 1, lines
    assert f"RadixFlow active (launcher, executor simulated): policy {policy}: " in lines[0]
    assert lines[0].endswith("; request checks on")
