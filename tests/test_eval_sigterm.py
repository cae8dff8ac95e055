"""SIGTERM (`timeout`, a job stop) on the eval tools that run for long: eval/multiproc.py stops
every server it started (no orphan process groups), eval/soak.py writes what it finished.
As tests/test_run_arms_workloads.py's run_arms test: a child runs the tool's `main` with its
server command replaced by `sleep` (no SGLang server needed), and is killed mid-run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MULTIPROC_CHILD = """
import sys, time
import eval.multiproc as m
from radixflow_sglang.testing.server import Server
m.server_cmd = lambda port, trace, extra: ["sleep", "600"]
started = []
def wait_ready(self, timeout):
    started.append(self.proc.pid)
    print(self.proc.pid, flush=True)
    if len(started) >= int(sys.argv[2]):
        while True:
            time.sleep(60)
Server.wait_ready = wait_ready
m.main([sys.argv[3], "--out", sys.argv[1]])
"""


def _alive(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("mode, servers", [("dp", 1), ("router", 2)])
def test_multiproc_sigterm_stops_every_server_it_started(tmp_path, mode, servers):
    proc = subprocess.Popen([sys.executable, "-c", MULTIPROC_CHILD, str(tmp_path), str(servers),
                             mode], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    pids: list[int] = []
    try:
        pids = [int(proc.stdout.readline()) for _ in range(servers)]
        assert all(_alive(p) for p in pids)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
        assert not any(_alive(p) for p in pids)  # every server's whole group is gone
    finally:
        proc.kill()
        proc.wait()
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p, signal.SIGKILL)  # NOTE: a failed run leaves no orphan


SOAK_CHILD = """
import sys, time
import eval.soak as s
real = s.run_policy
def run_policy(policy, arrivals, cfg, tick=None):
    if policy == "radix":
        print("blocked", flush=True)
        while True:
            time.sleep(60)
    return real(policy, arrivals, cfg, tick)
s.run_policy = run_policy
sys.exit(s.main(["--requests", "20", "--policies", "stock,radix", "--no-progress",
                 "--out", sys.argv[1]]))
"""


def test_soak_sigterm_writes_the_policies_it_finished(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", SOAK_CHILD, str(tmp_path)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert proc.stdout.readline() == "blocked\n"
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    doc = json.loads((tmp_path / "soak.json").read_text())
    assert list(doc["policies"]) == ["stock"]
    assert doc["policies"]["stock"]["requests"] == 20
    assert "radix" in doc["interrupted"]
