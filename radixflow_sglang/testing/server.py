"""A real SGLang server process for tests and live evals: start, wait ready, check, stop."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

READY_LINE = "ready to roll"  # SGLang logs it after its warm-up request
LEAK_MARKERS = ("memory leak detected", "Mem Leak Detected", "use-after-free", "double free")
# NOTE: scheduler round trips after the work is done. Each /server_info is answered in the
# receive step of one event-loop iteration (managers/scheduler.py event_loop_normal); an
# iteration without a batch then runs on_idle, whose strict memory check runs once the loop is
# fully idle (is_fully_idle: last_batch cleared too, one iteration after the last batch). The
# third answer therefore proves a fully idle iteration's check ran and did not raise.
IDLE_ROUND_TRIPS = 3
# NOTE: a server that never got ready is asked for its Python stacks before it is stopped:
# every process that ran radixflow_sglang/plugin.py register() dumps them on this signal.
STACK_SIGNAL = signal.SIGUSR2
STACK_WAIT_S = 10.0
# NOTE: starts per server by default. A CI run once saw a stock server alive but never ready
# (10 min, its log tail ending in start-up); the second start is what a user would do by hand.
START_ATTEMPTS = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def http_json(url: str, timeout: float = 10.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read() or b"null")


class ServerError(RuntimeError):
    pass


class StartTimeout(ServerError):
    """Alive but not ready within the start-up bound (a crash is a plain ServerError)."""


class Server:
    """A server process in its own session; stopped with SIGTERM to its process group."""

    def __init__(self, cmd: list[str], env: Mapping[str, str], log: Path, port: int,
                 cwd: Path | None = None) -> None:
        self.cmd, self.env, self.log, self.port, self.cwd = cmd, dict(env), log, port, cwd
        self.base = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None
        self.start_attempts = 0

    def __enter__(self) -> Server:
        self._start()
        return self

    def _start(self) -> None:
        if port_in_use(self.port):
            raise ServerError(f"port {self.port} is already in use")
        self.start_attempts += 1
        with open(self.log, "w") as out:
            out.write("$ " + shlex.join(self.cmd) + "\n")
            out.flush()
            self.proc = subprocess.Popen(self.cmd, cwd=self.cwd, env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def tail(self, n: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-n:] if self.log.exists() else ""

    def check_alive(self, what: str) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            raise ServerError(f"server exited rc={self.proc.returncode} {what}; log tail:\n"
                              + self.tail())

    def wait_ready(self, timeout: float, attempts: int = START_ATTEMPTS) -> None:
        """/health answers 200 and SGLang's warm-up request is done (its ready line).

        A server still alive but not ready after `timeout` has its stacks dumped into its log,
        which is kept as `<log>.attempt<k>`, and is started afresh, `attempts` starts in all
        (a start-up hang is not a measurement; a crash is never retried)."""
        while True:
            try:
                return self._wait_ready_once(timeout)
            except StartTimeout as e:
                if self.start_attempts >= attempts:
                    raise
                kept = self.log.with_name(f"{self.log.name}.attempt{self.start_attempts}")
                self.stop()
                self.log.replace(kept)
                print(f"[server] start {self.start_attempts} of {attempts} hung; its log and "
                      f"stacks: {kept}; starting again. {str(e)[:300]}", file=sys.stderr)
                self._start()

    def _wait_ready_once(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self.check_alive("during start-up")
            if time.monotonic() > deadline:
                before = self.tail()
                stacks = self.dump_stacks()
                raise StartTimeout(f"server not ready after {timeout:.0f} s (log: {self.log}); "
                                   f"log tail:\n{before}\nstacks on {STACK_SIGNAL.name}:\n"
                                   + (stacks[-3000:] or "(none written)"))
            if READY_LINE in self.tail(20_000) and self._healthy():
                return
            time.sleep(1.0)

    def dump_stacks(self) -> str:
        """Ask the server's process group for its Python stacks (faulthandler, registered by
        radixflow_sglang/plugin.py); what the log gained, once it stops growing (bounded)."""
        if self.proc is None or self.proc.poll() is not None:
            return ""
        size = self.log.stat().st_size if self.log.exists() else 0
        try:
            os.killpg(self.proc.pid, STACK_SIGNAL)
        except ProcessLookupError:
            return ""
        deadline, last = time.monotonic() + STACK_WAIT_S, -1
        while time.monotonic() < deadline:
            time.sleep(0.5)
            now = self.log.stat().st_size
            if now == last and now > size:
                break
            last = now
        with open(self.log, "rb") as f:
            f.seek(size)
            return f.read().decode(errors="replace")

    def wait_healthy(self, timeout: float) -> None:
        """/health answers 200 (a process without SGLang's ready line, e.g. the router)."""
        deadline = time.monotonic() + timeout
        while not self._healthy():
            self.check_alive("during start-up")
            if time.monotonic() > deadline:
                raise ServerError(f"no healthy answer after {timeout:.0f} s; log tail:\n"
                                  + self.tail())
            time.sleep(1.0)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base + "/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def idle_leak_check(self) -> dict[str, int | None]:
        """SGLang's strict idle invariant check (SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE=1)
        raises in the scheduler on any leaked KV / mamba / request slot. Call it once every
        request has answered: sequential scheduler round trips let a fully idle loop iteration
        run the check (IDLE_ROUND_TRIPS); a server still alive, without a leak message, has
        leaked nothing."""
        for _ in range(IDLE_ROUND_TRIPS):
            try:
                http_json(self.base + "/server_info", timeout=120)
            except (urllib.error.URLError, OSError) as e:
                self.check_alive("during the idle memory check")
                raise ServerError(f"/server_info failed during the idle memory check: {e}; "
                                  "log tail:\n" + self.tail()) from e
        self.check_alive("during the idle memory check")
        text = self.log.read_text(errors="replace")
        hits = [m for m in LEAK_MARKERS if m in text]
        if hits:
            raise ServerError(f"SGLang's idle memory check reported {hits}; log tail:\n"
                              + self.tail())
        return {"kv": 0, "mamba": 0}

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGTERM)
                try:
                    self.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    self.proc.wait(timeout=30)
            os.killpg(self.proc.pid, signal.SIGKILL)  # stragglers of the group
        except ProcessLookupError:
            pass


def strict_launcher(policy: str, port: int) -> tuple[list[str], dict[str, str]]:
    """(command, environment) of `python -m radixflow_sglang.launch_server` on the simulated
    executor, with SGLang's strict idle memory check on and no RADIXFLOW_* variable inherited."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADIXFLOW_")}
    env.update(PYTHONUNBUFFERED="1", SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE="1")
    cmd = [sys.executable, "-m", "radixflow_sglang.launch_server", "--host", "127.0.0.1",
           "--port", str(port), "--radixflow-policy", policy, "--radixflow-executor", "simulated"]
    return cmd, env


def request_json(url: str, body: dict | None = None, timeout: float = 60.0) -> tuple[int, Any]:
    """POST `body` as JSON (GET when None); returns (status, decoded JSON or None)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        raw = r.read()
        return r.status, json.loads(raw) if raw else None


def post_in_thread(url: str, body: dict, results: dict, key: str,
                   timeout: float = 300.0) -> threading.Thread:
    """POST `body` on a daemon thread (started); `results[key]` gets the JSON answer, or
    {"error": status} for an HTTP error (an aborted request may answer with one), or
    {"error": repr} for anything else (recorded, so the test fails on it instead of hanging)."""
    def send() -> None:
        try:
            results[key] = request_json(url, body, timeout=timeout)[1]
        except urllib.error.HTTPError as e:
            results[key] = {"error": e.code}
        except Exception as e:  # noqa: BLE001  NOTE: see the docstring
            results[key] = {"error": repr(e)}

    t = threading.Thread(target=send, daemon=True)
    t.start()
    return t
