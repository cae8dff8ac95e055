"""The launcher's flags, the child-process install and the plugin entry point."""

from __future__ import annotations

import subprocess
import sys

import pytest

from radixflow_sglang import launch_server as ls


def test_radixflow_flags_map_to_env_and_pass_sglang_args_through():
    ns, rest = ls.parse(["--model-path", "m", "--radixflow-policy", "traversal",
                         "--radixflow-admission-ms", "7.5", "--radixflow-theta", "128",
                         "--tp", "2"])
    assert rest == ["--model-path", "m", "--tp", "2"]
    env = ls.radixflow_env(ns)
    from radixflow_sglang.adapter.scheduler import config_from_env

    cfg = config_from_env(env)
    assert (cfg.policy, cfg.admission_ms, cfg.theta, cfg.frag_cap) == ("traversal", 7.5, 128, 2)
    assert env["RADIXFLOW_POLICY"] == "traversal"
    assert env["RADIXFLOW_ADMISSION_MS"] == "7.5" and env["RADIXFLOW_THETA"] == "128"


@pytest.mark.parametrize("argv, needle", [
    (["--radixflow-policy", "fast"], "--radixflow-policy: invalid choice: 'fast' (choose from"),
    (["--radixflow-admission-ms", "-1"], "--radixflow-admission-ms"),
    (["--radixflow-admission-ms", "soon"], "not a number"),
    (["--radixflow-executor", "gpu"], "choose from 'model', 'simulated'"),
    (["--radixflow-theta", "0"], "--radixflow-theta: 0 must be >= 1"),
    (["--radixflow-frag-cap", "x"], "--radixflow-frag-cap: 'x' is not an integer"),
    (["--radixflow-trace", "/no/such/dir/t.jsonl"], "--radixflow-trace: directory"),
    (["--radixflow-polcy", "radix"], "unrecognized radixflow argument"),
])
def test_bad_flags_fail_naming_the_flag(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        ls.parse(argv)
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_embedded_default_is_used_only_without_a_model_arg():
    assert not ls.has_model_arg(["--port", "1"])
    assert ls.has_model_arg(["--model-path=x"]) and ls.has_model_arg(["--model", "x"])


def test_child_install_swaps_the_scheduler_class_and_stock_restores_it():
    import sglang.srt.managers.scheduler as m

    from radixflow_sglang.adapter import entry
    from radixflow_sglang.adapter.scheduler import RadixFlowScheduler

    try:
        assert entry.install("traversal") is RadixFlowScheduler
        assert m.Scheduler is RadixFlowScheduler
        assert entry.install("stock") is entry._UPSTREAM_CLASS
        assert m.Scheduler is entry._UPSTREAM_CLASS
    finally:
        m.Scheduler = entry._UPSTREAM_CLASS


def test_plugin_is_registered_off_by_default_and_validates_policy(monkeypatch):
    from importlib.metadata import entry_points

    import sglang.srt.managers.scheduler as m

    from radixflow_sglang import plugin
    from radixflow_sglang.adapter import entry

    eps = {e.name: e.value for e in entry_points(group="sglang.srt.plugins")}
    assert eps.get("radixflow") == "radixflow_sglang.plugin:register"
    monkeypatch.delenv("RADIXFLOW_POLICY", raising=False)
    plugin.register()
    assert m.Scheduler is entry._UPSTREAM_CLASS
    monkeypatch.setenv("RADIXFLOW_POLICY", "nope")
    with pytest.raises(ValueError, match="--radixflow-policy: invalid choice 'nope'"):
        plugin.register()
    monkeypatch.setenv("RADIXFLOW_POLICY", "radixflow")
    try:
        plugin.register()
        assert m.Scheduler.__name__ == "RadixFlowScheduler"
    finally:
        m.Scheduler = entry._UPSTREAM_CLASS


def test_launcher_cli_rejects_bad_policy_before_starting_anything():
    r = subprocess.run([sys.executable, "-m", "radixflow_sglang.launch_server",
                        "--radixflow-policy", "bogus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "invalid choice: 'bogus'" in r.stderr
