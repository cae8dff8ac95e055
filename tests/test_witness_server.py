"""The served witness: SGLang's real server on CPU with the simulated executor, stock and
radixflow, overlap scheduling on. Every resumed state is checked; outputs must be identical."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from radixflow_sglang.testing.server import Server, free_port, request_json

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "radixflow_sglang" / "model_dirs" / "qwen3.5-0.8b"
START_TIMEOUT_S = 600  # NOTE: a hang bound: start-up takes minutes on a loaded 2-core box


def _serve_and_generate(policy: str, tmp: Path, prompts: list[list[int]]):
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1",
               RADIXFLOW_POLICY=policy)
    cmd = [sys.executable, "-m", "radixflow_sglang.adapter.simulated", "--model-path", str(MODEL),
           "--load-format", "dummy", "--device", "cpu", "--context-length", "8192",
           "--host", "127.0.0.1", "--port", str(port), "--enable-metrics",
           "--mamba-radix-cache-strategy", "extra_buffer", "--max-running-requests", "16",
           "--chunked-prefill-size", "1024", "--sleep-on-idle"]
    with Server(cmd, env, tmp / f"{policy}.log", port, cwd=ROOT) as srv:
        srv.wait_ready(START_TIMEOUT_S)

        def gen(ids):
            code, out = request_json(srv.base + "/generate", {
                "input_ids": ids, "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}})
            assert code == 200, out
            return tuple(out["output_ids"])

        with ThreadPoolExecutor(16) as pool:  # NOTE: a burst: consumers meet live producers
            outputs = list(pool.map(gen, prompts))
        _, info = request_json(srv.base + "/server_info")
        with open(tmp / f"{policy}.log") as f:
            log = f.read()
        return outputs, info["internal_states"][0]["witness"], _metrics(srv.base), log


def _metrics(base: str) -> str:
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        return r.read().decode()


@pytest.mark.slow  # two server start-ups
def test_served_witness_stock_and_radixflow_agree(tmp_path):
    if not (MODEL / "tokenizer.json").exists():
        subprocess.run([sys.executable, "-m", "radixflow_sglang.tokenizer", "--ensure",
                        str(MODEL)], cwd=ROOT, check=True, timeout=300)
    rng = random.Random(0)
    prompts = []
    for _ in range(4):  # 4 groups of 4 siblings: a shared document, then a question each
        doc = [rng.randrange(1000, 100_000) for _ in range(rng.randrange(1500, 2500))]
        prompts += [doc + [rng.randrange(1000, 100_000) for _ in range(48)] for _ in range(4)]
    runs = {p: _serve_and_generate(p, tmp_path, prompts) for p in ("stock", "radixflow")}
    for policy, (_outputs, witness, metrics, log) in runs.items():
        assert witness["mismatched"] == 0, (policy, witness["first_mismatches"])
        assert witness["requests"] >= len(prompts) and witness["resumed"] > 0, witness
        assert "radixflow_witness_mismatched_total" in metrics, policy
        assert "witness: request" not in log
    assert runs["stock"][0] == runs["radixflow"][0]
    assert len(set(runs["stock"][0])) == len(prompts)  # outputs depend on each prompt's states
