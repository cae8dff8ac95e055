"""The test/eval server harness's start-up (radixflow_sglang/testing/server.py): a server that
hangs before it is ready leaves its stacks in its log and is started once more; a crash is not
retried. The stand-in server below hangs on its first start and serves on its second, so what
the harness does is decided by the marker file, not by timing (the timeout only bounds it)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from radixflow_sglang.testing.server import READY_LINE, Server, ServerError, StartTimeout, free_port

ROOT = Path(__file__).resolve().parents[1]
HANG_BOUND_S = 10.0

STAND_IN = f'''
import faulthandler, http.server, signal, sys, threading
from pathlib import Path

faulthandler.register(signal.SIGUSR2, all_threads=True)
port, marker, mode = int(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
if mode == "crash":
    sys.exit("stand-in: failed to load")
if not marker.exists():
    marker.write_text("hung once")

    def stuck_in_warmup():
        threading.Event().wait()

    stuck_in_warmup()


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


srv = http.server.HTTPServer(("127.0.0.1", port), Health)
print("{READY_LINE}", flush=True)
srv.serve_forever()
'''


def _server(tmp_path: Path, mode: str = "hang-once") -> Server:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    port = free_port()
    cmd = [sys.executable, str(script), str(port), str(tmp_path / "marker"), mode]
    return Server(cmd, dict(os.environ, PYTHONUNBUFFERED="1"), tmp_path / "server.log", port)


def test_a_hung_start_dumps_its_stacks_and_starts_again(tmp_path):
    with _server(tmp_path) as srv:
        srv.wait_ready(HANG_BOUND_S, attempts=2)
        assert srv.start_attempts == 2
        assert srv._healthy()
        kept = (tmp_path / "server.log.attempt1").read_text()
        assert "stuck_in_warmup" in kept  # the hung start's stack, dumped before it was stopped
        assert READY_LINE in srv.tail()
        assert "stuck_in_warmup" not in srv.tail()


def test_a_hung_start_without_a_retry_fails_with_its_stacks(tmp_path):
    with _server(tmp_path) as srv, pytest.raises(StartTimeout) as e:
        srv.wait_ready(HANG_BOUND_S, attempts=1)
    assert "stuck_in_warmup" in str(e.value)
    assert str(tmp_path / "server.log") in str(e.value)
    assert srv.start_attempts == 1


def test_a_crash_at_start_is_not_retried(tmp_path):
    with _server(tmp_path, mode="crash") as srv, pytest.raises(ServerError) as e:
        srv.wait_ready(HANG_BOUND_S, attempts=3)
    assert not isinstance(e.value, StartTimeout)
    assert "failed to load" in str(e.value)
    assert srv.start_attempts == 1
