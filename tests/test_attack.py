"""eval/attack.py: its checks on crafted /server_info states, and the attack on a real server."""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path

import pytest

from eval import attack
from radixflow_sglang.testing.server import Server, free_port

ROOT = Path(__file__).resolve().parents[1]
CLEAN = {"wait_set": 0, "wait_rule": "cost-aware", "quiet_scans": 9,
         "records": {"requests": 0, "wait_set": 0, "boundary": 0}}


def test_an_idle_rank_holding_a_record_or_a_parked_request_fails_by_name():
    leak = {**CLEAN, "wait_set": 2, "records": {**CLEAN["records"], "requests": 2}}
    bad = attack.judge([{"radixflow": CLEAN}, {"radixflow": leak}], "after wave 1")
    assert bad == ["after wave 1: rank 1 wait_set 2 with nothing running",
                   "after wave 1: rank 1 records left {'requests': 2}"]
    assert attack.judge([{"radixflow": CLEAN}, {}], "x") == []  # a stock rank keeps none
    mism = {"radixflow": CLEAN, "witness": {"mismatched": 1, "first_mismatches": ["r: state"]}}
    assert attack.judge([mism], "end") == ["end: rank 0 witness mismatched 1: ['r: state']"]


def test_a_server_error_fails_and_a_queue_limit_or_a_disconnect_does_not():
    assert attack.server_errors(Counter({200: 5, 400: 2, 503: 3, None: 1}), "w") == []
    assert attack.server_errors(Counter({200: 5, 500: 1}), "w") == ["w: server errors {500: 1}"]


def test_quiet_scans_are_summed_over_ranks_only_for_a_cost_aware_rule():
    assert attack.quiet_sum([{"radixflow": CLEAN}, {"radixflow": CLEAN}]) == 18
    assert attack.quiet_sum([{"radixflow": {**CLEAN, "wait_rule": "always"}}]) is None
    assert attack.quiet_sum([{}]) is None


def test_a_server_that_stops_answering_fails_the_check_it_was_at():
    bad = attack.attack(f"http://127.0.0.1:{free_port()}", 1, 4, 0, 1.0, log=lambda _: None)
    assert bad[0] == "opening: a duplicate rid or bad input went unanswered", bad
    assert bad[-1].startswith("wave 0: the server stopped answering"), bad


def test_no_server_is_an_argument_error(capsys):
    with pytest.raises(SystemExit) as e:
        attack.main(["--base", f"http://127.0.0.1:{free_port()}"])
    assert e.value.code == 2 and "--base" in capsys.readouterr().err


@pytest.mark.slow  # one server start-up
def test_the_attack_leaves_a_default_server_clean(tmp_path):
    port = free_port()
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env.pop("RADIXFLOW_POLICY", None)
    cmd = [sys.executable, "-m", "radixflow_sglang.launch_server", "--host", "127.0.0.1",
           "--port", str(port), "--enable-mixed-chunk"]
    with Server(cmd, env, tmp_path / "server.log", port, cwd=ROOT) as srv:
        srv.wait_ready(600)  # NOTE: a hang bound
        assert attack.main(["--base", srv.base, "--waves", "2", "--requests", "24",
                            "--json", str(tmp_path / "a.json")]) == 0
        srv.check_alive("after the attack")
