"""End to end through the front door: `python -m radixflow_sglang.launch_server` (embedded
Qwen3.5-0.8B geometry, simulated executor) as a real server on 127.0.0.1."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

from radixflow_sglang.testing.server import Server, free_port, request_json  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("server")
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE="1",  # SGLang's own leak check raises
               RADIXFLOW_SIM_BETA="2e-4")  # 2,000 tokens take 0.4 s: long enough to abort
    env.pop("RADIXFLOW_POLICY", None)
    log = tmp / "server.log"
    cmd = [sys.executable, "-m", "radixflow_sglang.launch_server", "--host", "127.0.0.1",
           "--port", str(port), "--enable-metrics", "--disable-overlap-schedule",
           # NOTE: a 50 ms unconditional hold (radixflow-always), so concurrent test branches
           # share a round on a busy 2-core box; radixflow's cost-aware hold releases a lone
           # arrival at once (no arrival history), so they would land in separate rounds
           "--radixflow-policy", "radixflow-always", "--radixflow-admission-ms", "50",
           "--radixflow-trace", str(tmp / "trace.jsonl")]
    with Server(cmd, env, log, port, cwd=ROOT) as srv:  # NOTE: eval/run_arms.py's server handling
        srv.wait_ready(300)
        yield srv.base, srv.proc, log, tmp / "trace.jsonl"


def _generate(base, ids, rid=None):
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "ignore_eos": True}}
    if rid:
        body["rid"] = rid
    return request_json(base + "/generate", body, timeout=120)[1]


def _events(trace: Path) -> list[dict]:
    return [json.loads(x) for x in trace.read_text().splitlines()] if trace.exists() else []


def test_four_branches_park_then_hit_the_fork_state(server):
    base, _, _, trace = server
    doc = list(range(10_000, 12_000))
    branches = [doc + [20_000 + 50 * i + j for j in range(40)] for i in range(4)]
    with ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(lambda ids: _generate(base, ids), branches))
    info = request_json(base + "/server_info")[1]["internal_states"][0]["radixflow"]
    assert info["policy"] == "radixflow-always" and info["grid"] == 64 and info["blocked"] >= 1
    # no_buffer (SGLang's choice without overlap) cuts the producer at the fork: 2,000;
    # extra_buffer publishes on the grid: 1,984.
    fork = len(doc) if info["layout"] == "no_buffer" else len(doc) // 64 * 64
    cached = sorted(o["meta_info"]["cached_tokens"] for o in outs)
    assert cached[0] == 0 and cached[1:] == [fork] * 3  # one producer; the rest hit the fork
    rounds = [e for e in _events(trace) if e["event"] == "round"]
    assert sum(e["blocked"] for e in rounds) == info["blocked"]
    # the round-cost fit ran on the simulated executor's measured forwards
    assert info["wait_rule"] == "always" and "always hold" in info["composition"]
    forwards = [e for e in _events(trace) if e["event"] == "forward"]
    assert forwards and all(e["duration_s"] > 0 for e in forwards)
    assert info["cost"]["observed"] == len(forwards) and info["cost"]["beta_s"] > 0


def test_sglang_frontend_fork_program_runs_unchanged(server):
    import sglang as sgl

    base = server[0]

    @sgl.function
    def four(s, doc, q, opts):
        s += "Article:\n" + doc + "\nQuestion: " + q + "\nAnswer:"
        forks = s.fork(len(opts))
        for f, o in zip(forks, opts, strict=True):
            f += " " + o + "\nCorrect? yes or no:" + sgl.gen("v", max_tokens=1, ignore_eos=True)
        s["vs"] = [f["v"] for f in forks]

    st = four.run(doc="Foxes jump over dogs. " * 200, q="What do foxes do?",
                  opts=["jump", "sleep", "run", "bark"], backend=sgl.RuntimeEndpoint(base))
    assert len(st["vs"]) == 4 and all(isinstance(v, str) for v in st["vs"])


def test_metrics_count_radixflow_rounds(server):
    base = server[0]
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:
        text = r.read().decode()
    rounds = [ln for ln in text.splitlines() if ln.startswith("radixflow_rounds_total")]
    assert rounds and float(rounds[0].rsplit(" ", 1)[1]) >= 2
    assert "radixflow_blocked_total" in text and "radixflow_round_tokens_bucket" in text
    assert 'radixflow_round_cost{' in text and 'term="beta"' in text
    assert "radixflow_forward_seconds_bucket" in text


def test_abort_while_parked_leaks_nothing(server):
    base, proc, log, trace = server
    doc = list(range(30_000, 32_000))
    ids = {f"park-{i}": doc + [40_000 + 50 * i + j for j in range(40)] for i in range(3)}
    results = {}

    def send(rid):
        try:
            results[rid] = _generate(base, ids[rid], rid=rid)
        except urllib.error.HTTPError as e:  # an aborted request may answer with an error
            results[rid] = {"error": e.code}

    before = request_json(base + "/server_info")[1]["internal_states"][0]["radixflow"]["blocked"]
    threads = [threading.Thread(target=send, args=(rid,)) for rid in ids]
    for t in threads:  # together, inside one admission hold: one produces, two park
        t.start()
    time.sleep(0.2)  # the producer's forward takes ~0.4 s; the other two are parked now
    request_json(base + "/abort_request", {"rid": "park-2"})
    for t in threads:
        t.join(timeout=120)
    info = request_json(base + "/server_info")[1]["internal_states"][0]["radixflow"]
    assert info["blocked"] - before >= 2
    done = [results[r] for r in ("park-0", "park-1")]
    assert all(d["meta_info"]["finish_reason"]["type"] == "length" for d in done)
    assert max(d["meta_info"]["cached_tokens"] for d in done) >= 1984
    aborted = results["park-2"]
    assert "error" in aborted or aborted["meta_info"]["finish_reason"]["type"] == "abort"
    time.sleep(2)  # idle: SGLang's strict leak check runs and would raise on a leak
    assert request_json(base + "/health", timeout=10)[0] == 200 and proc.poll() is None
    assert "memory leak detected" not in log.read_text()


def test_server_shuts_down_cleanly(server):
    _, proc, log, _ = server
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(timeout=30) is not None
    assert "Traceback" not in log.read_text()
