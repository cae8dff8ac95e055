"""`--enable-mixed-chunk` through a real server with the simulated executor, overlap on.

SGLang mixes the running batch's decode rows into a prefill batch (schedule_batch.py
`mix_with_running`): each becomes a one-token extend at seq_len - 1, and under overlap that
token is still in flight, so the row runs one past the request's `full_untruncated_fill_ids`.
The witness read the row's tokens from there and the scheduler died with an IndexError on the
first mixed forward (`serve --enable-mixed-chunk`, any policy). It now reads the token it
sampled itself (adapter/witness.py `_row_tokens`).

Deterministic: the forward gate (radixflow_sglang/testing/gate.py) holds A's decode forward
until B is queued, so the next round is B's prefill mixed with A's decode; no sleeps."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from radixflow_sglang.testing.gate import GateControl
from radixflow_sglang.testing.server import Server, free_port, post_in_thread, request_json

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def _send(base: str, rid: str, ids: list[int], out: int, results: dict):
    body = {"rid": rid, "input_ids": ids,
            "sampling_params": {"max_new_tokens": out, "ignore_eos": True}}
    return post_in_thread(base + "/generate", body, results, rid)


def test_a_decode_row_mixed_into_a_prefill_under_overlap(tmp_path):
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1", RADIXFLOW_SIM_GATE=str(tmp_path / "gate"))
    env.pop("RADIXFLOW_POLICY", None)
    cmd = [sys.executable, "-m", "radixflow_sglang.launch_server", "--host", "127.0.0.1",
           "--port", str(port), "--enable-mixed-chunk", "--mamba-radix-cache-strategy",
           "extra_buffer"]
    with Server(cmd, env, tmp_path / "server.log", port, cwd=ROOT) as srv:
        srv.wait_ready(600)  # NOTE: a hang bound
        gate = GateControl(tmp_path / "gate", alive=lambda: srv.check_alive("while it waits"))
        results: dict = {}
        gate.close()
        threads = [_send(srv.base, "A", list(range(30_000, 30_300)), 8, results)]
        prefill = gate.wait(lambda st: "A" in st["batch"], "A's prefill")
        gate.release(prefill["forward"])
        a = gate.wait(lambda st: st["forward"] > prefill["forward"], "A's decode")
        assert a["batch"] == ["A"] and not a["extend"], a
        threads.append(_send(srv.base, "B", list(range(60_000, 60_400)), 2, results))
        gate.wait(lambda st: "B" in st["waiting"], "B queued")
        gate.release(a["forward"])
        mixed = gate.wait(lambda st: st["forward"] > a["forward"], "the next forward")
        assert {"A", "B"} <= set(mixed["batch"]) and mixed["extend"], mixed
        gate.open()
        for t in threads:
            t.join(timeout=300)
        assert not any(t.is_alive() for t in threads), "a request never answered"
        for rid, out in (("A", 8), ("B", 2)):
            assert "meta_info" in results[rid], results  # NOTE: the scheduler died: an error
            assert results[rid]["meta_info"]["finish_reason"] == {"type": "length",
                                                                  "length": out}, results
        witness = request_json(srv.base + "/server_info")[1]["internal_states"][0]["witness"]
        assert witness["mismatched"] == 0 and witness["states_checked"] > 0, witness
