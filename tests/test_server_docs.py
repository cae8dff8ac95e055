"""What the README and the operator see match what a real server exposes (issue 37): the README's
Prometheus names and `/server_info` fields exist under the names it gives, `/health` polls move
no RadixFlow counter, and every setting in force is in the start-up line and `/server_info`.

One real server (`python -m radixflow_sglang.launch_server`, simulated executor, radixflow policy,
`--enable-metrics`, `--radixflow-chat-boundary on`: a non-default setting must show)."""

from __future__ import annotations

import os
import re
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from pathlib import Path

import pytest

from radixflow_sglang.testing.server import Server, free_port, request_json

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
SERVER_INFO_PATH = "internal_states[0].radixflow"
HEALTH_POLLS = 100
COUNTERS = ("rounds", "scheduled_tokens", "quiet_scans", "hit_tokens", "blocked")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("docs")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADIXFLOW_")}
    env.update(PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "radixflow_sglang.launch_server", "--host", "127.0.0.1",
           "--port", str(port), "--radixflow-executor", "simulated", "--enable-metrics",
           "--radixflow-chat-boundary", "on"]
    with Server(cmd, env, tmp / "server.log", port, cwd=ROOT) as srv:
        srv.wait_ready(600)  # NOTE: a hang bound
        yield srv


def radixflow_info(srv: Server) -> dict:
    return request_json(srv.base + "/server_info")[1]["internal_states"][0]["radixflow"]


def metric_samples(srv: Server) -> dict[str, float]:
    with urllib.request.urlopen(srv.base + "/metrics", timeout=30) as r:
        lines = r.read().decode().splitlines()
    out: dict[str, float] = {}
    for line in lines:
        if line.startswith("radixflow_"):
            name = re.split(r"[{ ]", line, maxsplit=1)[0]
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def test_the_readme_names_what_the_server_exposes(server):
    assert f"`{SERVER_INFO_PATH}`" in README
    info = radixflow_info(server)
    fields_named = set(re.findall(r"`radixflow\.([a-z_]+)`", README))
    assert {"quiet_scans", "newcomer_deferred", "boundaries", "health_checks", "settings"} \
        <= fields_named
    assert fields_named <= set(info), fields_named - set(info)
    metrics = set(re.findall(r"`(radixflow_[a-z_]+)(?:\{[a-z]+\})?`", README))
    from radixflow_sglang.config import KWARG_NAMES

    # NOTE: the request field, the package, radixflow_sglang.Engine's keywords and their rule
    metrics -= {"radixflow_boundary", "radixflow_sglang", "radixflow_x_y", *KWARG_NAMES.values()}
    assert {"radixflow_quiet_scans_total", "radixflow_rounds_total"} <= metrics
    assert metrics <= set(metric_samples(server)), metrics - set(metric_samples(server))


def test_health_polls_move_no_radixflow_counter(server):
    before, prom = radixflow_info(server), metric_samples(server)

    def health(_: int) -> int:
        with urllib.request.urlopen(server.base + "/health", timeout=60) as r:
            return r.status

    with ThreadPoolExecutor(10) as ex:  # NOTE: each poll waits ~1 s for its prefill (SGLang)
        assert set(ex.map(health, range(HEALTH_POLLS))) == {200}
    after, prom_after = radixflow_info(server), metric_samples(server)
    assert after["health_checks"] > before["health_checks"]  # they ran, counted apart
    assert {k: after[k] for k in COUNTERS} == {k: before[k] for k in COUNTERS}
    for name in ("radixflow_rounds_total", "radixflow_quiet_scans_total",
                 "radixflow_round_tokens_count", "radixflow_forward_seconds_count"):
        assert prom_after[name] == prom[name], name
    # a real request still counts
    request_json(server.base + "/generate", {"input_ids": [5, 6, 7],
                                             "sampling_params": {"max_new_tokens": 1}})
    assert radixflow_info(server)["rounds"] > before["rounds"]


def test_every_setting_in_force_is_in_the_start_up_line_and_server_info(server):
    from radixflow_sglang.config import RadixFlowConfig

    names = [f.name for f in fields(RadixFlowConfig)]
    settings = radixflow_info(server)["settings"]
    assert sorted(settings) == sorted(names)
    assert settings["chat_boundary"] == "on" and settings["theta"] == 64
    assert settings["drain_timeout"] == 30.0 and settings["admission_ms"] == 5.0
    [line] = [x for x in server.log.read_text().splitlines() if "RadixFlow active" in x]
    shown = dict(kv.split("=", 1) for kv in line.split("; settings ")[1].split(";")[0].split())
    assert sorted(shown) == sorted(names) and shown["chat_boundary"] == "on", line
    # NOTE: resolved values, as /server_info shows them (the line printed theta=default)
    assert shown["theta"] == str(settings["theta"]) and "default" not in shown.values(), line
