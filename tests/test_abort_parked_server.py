"""Aborts of parked requests through a real server, both mamba layouts (issue 50's leak).

A request aborted while parked once stayed in the wait set for good: `/server_info`
`radixflow.wait_set` read 1 -> 3 -> 5 over three waves with nothing queued, and every later
scan lost its quiet path. SGLang's abort of a queued request (`abort_request`, the queue-limit
eviction) calls `_release_aborted_request`, where RadixFlow now forgets the request; every
per-request record ends with its request (`radixflow.records` reads zeros when idle).

Deterministic: the forward gate (radixflow_sglang/testing/gate.py) holds each wave's producer
forward until the test has seen who is parked and has aborted them; no sleeps. The wave's
requests enter the queue one at a time, in order, and the wait rule's clock-derived inputs are
pinned (`--radixflow-round-overhead-ms`, `--radixflow-arrival-rate`): a busy host moves neither
the queue's order nor any decision."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from radixflow_sglang.testing.gate import GateControl
from radixflow_sglang.testing.server import Server, free_port, post_in_thread, request_json

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow
LAYOUTS = {"no_buffer": [], "extra_buffer": ["--mamba-radix-cache-strategy", "extra_buffer"]}


@pytest.fixture(scope="module", params=list(LAYOUTS))
def server(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"abort-{request.param}")
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE="1",  # SGLang's own leak check raises
               RADIXFLOW_SIM_GATE=str(tmp / "gate"),
               RADIXFLOW_SIM_BETA="1e-4")  # NOTE: recomputing a shared document costs a wait
    env.pop("RADIXFLOW_POLICY", None)
    cmd = [sys.executable, "-m", "radixflow_sglang.launch_server", "--host", "127.0.0.1",
           "--port", str(port), "--disable-overlap-schedule", "--radixflow-admission-ms", "50",
           "--radixflow-round-overhead-ms", "0", "--radixflow-arrival-rate", "0",
           *LAYOUTS[request.param]]
    with Server(cmd, env, tmp / "server.log", port, cwd=ROOT) as srv:
        srv.wait_ready(600)  # NOTE: a hang bound
        gate = GateControl(tmp / "gate", alive=lambda: srv.check_alive("while a test waits"))
        yield SimpleNamespace(base=srv.base, srv=srv, gate=gate, layout=request.param)


def _info(s) -> dict:
    return request_json(s.base + "/server_info")[1]["internal_states"][0]["radixflow"]


def _send(s, rid: str, ids: list[int], out: int, results: dict) -> threading.Thread:
    body = {"rid": rid, "input_ids": ids,
            "sampling_params": {"max_new_tokens": out, "ignore_eos": True}}
    return post_in_thread(s.base + "/generate", body, results, rid)


def _wave(s, w: int, results: dict) -> list[str]:
    """Four groups of three siblings on 1,500-token documents queue behind a held blocker; the
    producers' forward is held until every parked request is aborted. Returns the aborted."""
    first = 20_000 + 40_000 * w  # NOTE: every id within the 0.8B vocabulary (248,320)
    docs = [list(range(first + 2_000 * g, first + 2_000 * g + 1_500)) for g in range(4)]
    ids = {f"w{w}-g{g}-{i}": docs[g] + [90_000 + 97 * i + j + 7 * g for j in range(30)]
           for g in range(4) for i in range(3)}
    s.gate.close()
    threads = [_send(s, f"w{w}-blocker", list(range(150_000 + w, 150_100 + w)), 1, results)]
    blocker = s.gate.wait(lambda st: f"w{w}-blocker" in st["batch"], "the blocker's forward")
    for i, (rid, x) in enumerate(ids.items()):  # NOTE: in order: the queue's order is fixed
        threads.append(_send(s, rid, x, (10, 50, 100)[i % 3], results))
        s.gate.wait(lambda st, rid=rid: rid in st["waiting"] or set(results) & set(ids),
                    f"{rid} queued")
    assert not set(results) & set(ids), results  # NOTE: none answered before its round
    s.gate.release(blocker["forward"])
    prod = s.gate.wait(lambda st: st["forward"] > blocker["forward"], "the producers' forward")
    parked = [r for r in prod["waiting"] if r in ids]  # NOTE: parked, or left for the budget
    assert parked and _info(s)["wait_set"] >= 1, (prod, _info(s))
    for rid in parked:
        request_json(s.base + "/abort_request", {"rid": rid})
    s.gate.wait(lambda st: not set(parked) & set(st["waiting"]), f"wave {w}'s aborts")
    assert _info(s)["wait_set"] == 0  # NOTE: at once, before any later round
    s.gate.open()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a request never answered"
    return parked


def test_parked_requests_aborted_in_waves_leave_no_record(server):
    s, results = server, {}
    aborted = [rid for w in range(3) for rid in _wave(s, w, results)]
    assert len(aborted) >= 3
    for rid, r in results.items():
        if rid in aborted:
            assert "error" in r or r["meta_info"]["finish_reason"]["type"] == "abort", r
        else:
            assert r["meta_info"]["finish_reason"]["type"] == "length", (rid, r)
    info = _info(s)
    assert info["wait_set"] == 0 and not any(info["records"].values()), info["records"]
    # the quiet path is back: lone unrelated requests scan quiet again, one scan each
    quiet = info["quiet_scans"]
    for i in range(3):
        _send(s, f"lone-{i}", list(range(70_000 + 500 * i, 70_000 + 500 * i + 200)), 1,
              results).join(timeout=300)
        assert results[f"lone-{i}"]["meta_info"]["finish_reason"]["type"] == "length"
    assert _info(s)["quiet_scans"] - quiet >= 3
    s.srv.idle_leak_check()  # SGLang's strict idle check passed: no slot leaked either
