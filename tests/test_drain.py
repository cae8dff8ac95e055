"""A bounded SIGTERM drain (`--radixflow-drain-timeout`, adapter/drain.py): with 20 long requests
in flight the server exits within the bound (plus start-up-free slack) with no process of its
tree left, its clients get an answer, and a request sent during the drain gets 503.

Event-driven: SIGTERM goes out once every stream has produced its first token (all 20 decoding),
the 503 request once `/health` says the drain began. The only clock is the exit bound.
Each forward is slowed (RADIXFLOW_SIM_ALPHA) so that the requests would need minutes: an
unbounded drain (SGLang's) cannot pass."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

from radixflow_sglang.testing.server import Server, free_port

ROOT = Path(__file__).resolve().parents[1]
DRAIN_S = 5
SLACK_S = 40  # NOTE: abort answers, scheduler exit and process-tree kill on a busy 2-core box
REQUESTS, NEW_TOKENS = 20, 4000
STEP_S = 0.02  # simulated forward fixed cost: 4,000 steps take >= 80 s, far past the bound

pytestmark = pytest.mark.slow


def post(base: str, path: str, body: dict) -> tuple[int, str]:
    req = urllib.request.Request(base + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def health(base: str) -> int:
    try:
        with urllib.request.urlopen(base + "/health", timeout=60) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


class Stream(threading.Thread):
    """One streamed /generate: `started` once its first token arrived; `finish` its last
    finish_reason (None: the stream ended without one)."""

    def __init__(self, base: str, i: int) -> None:
        super().__init__(daemon=True)
        self.base, self.i = base, i
        self.started = threading.Event()
        self.finish: dict | None = None
        self.error: str | None = None

    def run(self) -> None:
        body = {"input_ids": [1000 + self.i, 5, 6, 7], "stream": True,
                "sampling_params": {"max_new_tokens": NEW_TOKENS, "ignore_eos": True}}
        req = urllib.request.Request(self.base + "/generate", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                for line in r:
                    if line.startswith(b"data: {"):
                        self.started.set()
                        event = json.loads(line[6:])
                        self.finish = event.get("meta_info", {}).get("finish_reason") or \
                            self.finish
        except Exception as e:  # NOTE: recorded; a connection cut at exit is an answer too
            self.error = repr(e)
        finally:
            self.started.set()


def test_sigterm_with_long_requests_in_flight_exits_within_the_drain_bound(tmp_path):
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADIXFLOW_")}
    env.update(PYTHONUNBUFFERED="1", RADIXFLOW_SIM_ALPHA=str(STEP_S))
    cmd = [sys.executable, "-m", "radixflow_sglang.launch_server", "--host", "127.0.0.1",
           "--port", str(port), "--radixflow-executor", "simulated",
           "--radixflow-drain-timeout", str(DRAIN_S), "--max-running-requests", "32"]
    with Server(cmd, env, tmp_path / "server.log", port, cwd=ROOT) as srv:
        srv.wait_ready(600)  # NOTE: a hang bound
        streams = [Stream(srv.base, i) for i in range(REQUESTS)]
        for s in streams:
            s.start()
        for s in streams:
            assert s.started.wait(300), "a stream never started"  # NOTE: a hang bound
        assert not any(s.error or s.finish for s in streams), "finished before SIGTERM"
        tree = psutil.Process(srv.proc.pid).children(recursive=True)
        assert tree, "the server has no child processes"
        os.kill(srv.proc.pid, signal.SIGTERM)  # NOTE: the launcher only, as an orchestrator
        while health(srv.base) != 503:  # NOTE: the drain began (SGLang's own health answer)
            srv.check_alive("before the drain began")
        status, text = post(srv.base, "/generate", {"text": "Hello",
                                                     "sampling_params": {"max_new_tokens": 1}})
        assert status == 503 and "--radixflow-drain-timeout 5 s" in text, (status, text)
        srv.proc.wait(timeout=DRAIN_S + SLACK_S)  # NOTE: TimeoutExpired fails the test
        for s in streams:
            s.join(timeout=60)
        assert not any(s.is_alive() for s in streams), "a client never got an answer"
        assert all(s.finish is None or s.finish["type"] == "abort" for s in streams), \
            [s.finish for s in streams]
        left = [p.pid for p in tree if alive(p)]
        assert not left, f"processes of the server left: {left}"
        log = srv.log.read_text()
        assert f"drain timeout {DRAIN_S}s (--radixflow-drain-timeout) reached; aborting " \
               f"{REQUESTS} requests" in log
