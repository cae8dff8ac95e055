"""SGLang 0.5.23's real HTTP server, tokenizer, detokenizer, scheduler and radix cache on CPU,
with only the model worker simulated (radixflow_sglang/adapter/simulated.py)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from radixflow_sglang.testing.server import Server, free_port, request_json

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "radixflow_sglang" / "model_dirs" / "qwen3.5-0.8b"
START_TIMEOUT_S = 600  # NOTE: a hang bound: start-up takes minutes on a loaded 2-core box


@pytest.fixture(params=["stock"])  # radixflow: test_server_e2e.py
def server(request, tmp_path):
    if not (MODEL / "tokenizer.json").exists():
        subprocess.run([sys.executable, "-m", "radixflow_sglang.tokenizer", "--ensure", str(MODEL)],
                       cwd=ROOT, check=True, timeout=300)
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    env["RADIXFLOW_POLICY"] = request.param  # stock: SGLang's own scheduler class
    if request.param != "stock":  # NOTE: a trace under stock is a start-up error (config.py)
        env["RADIXFLOW_TRACE"] = str(tmp_path / "trace.jsonl")
    log = tmp_path / "server.log"
    cmd = [
        sys.executable, "-m", "radixflow_sglang.adapter.simulated",
        "--model-path", str(MODEL), "--load-format", "dummy", "--device", "cpu",
        "--context-length", "8192", "--host", "127.0.0.1", "--port", str(port),
        "--disable-overlap-schedule", "--mamba-radix-cache-strategy", "extra_buffer",
        "--max-running-requests", "16", "--chunked-prefill-size", "8192",
        "--max-prefill-tokens", "8192",
        "--sleep-on-idle",  # SGLang's own: an idle scheduler polls its sockets, not a busy loop
    ]
    with Server(cmd, env, log, port, cwd=ROOT) as srv:  # NOTE: eval/run_arms.py's server handling
        srv.wait_ready(START_TIMEOUT_S)
        yield srv, log, request.param


@pytest.mark.slow  # ~50-65 s per policy on 2 cores, almost all of it SGLang's process start-up
def test_four_branches_on_a_shared_document(server):
    srv, log, policy = server
    base, proc = srv.base, srv.proc
    rng = random.Random(0)
    doc = [rng.randrange(1000, 100_000) for _ in range(2000)]
    branches = [doc + [rng.randrange(1000, 100_000) for _ in range(40)] for _ in range(4)]

    def generate(ids):
        return request_json(base + "/generate",
                        {"input_ids": ids, "sampling_params": {"max_new_tokens": 1}})[1]

    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(generate, branches))
    assert len(outs) == 4
    for ids, out in zip(branches, outs, strict=True):
        assert len(out["output_ids"]) == 1
        assert out["meta_info"]["finish_reason"]["type"] == "length"
        assert out["meta_info"]["prompt_tokens"] == len(ids)

    # The real radix cache served the shared document to a later request.
    again = generate(doc + [7] * 40)
    assert again["meta_info"]["cached_tokens"] >= 1024

    # Deterministic simulated output: same prompt, same token.
    assert generate(branches[0])["output_ids"] == outs[0]["output_ids"]

    status, info = request_json(base + "/server_info")
    assert status == 200
    assert info["mamba_radix_cache_strategy"] == "extra_buffer"
    assert info["disable_overlap_schedule"] is True

    text = log.read_text()
    cls = "Scheduler" if policy == "stock" else "RadixFlowScheduler"
    assert f"simulated model worker, scheduler class {cls}, " in text
    trace = log.parent / "trace.jsonl"
    if policy == "radixflow":  # our scan ran inside SGLang's own event loop
        rounds = [json.loads(x) for x in trace.read_text().splitlines()]
        assert any(r["event"] == "round" and r["scheduled_tokens"] > 0 for r in rounds)
    else:
        assert not trace.exists()

    # A hang can be read from the log: every process that loaded our plugin (the launcher,
    # the scheduler, the detokenizer) writes its stacks on SIGUSR2 and goes on serving.
    stacks = srv.dump_stacks()
    for where in ("event_loop_normal", "detokenizer_manager.py", "uvicorn"):
        assert where in stacks, where
    assert generate(branches[1])["output_ids"] == outs[1]["output_ids"]

    # Clean shutdown: SIGTERM drains and exits the whole process tree.
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=120) is not None  # NOTE: a hang bound, not a timing claim
    assert "Traceback" not in log.read_text()
