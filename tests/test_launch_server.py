"""The launcher's flags, the child-process install and the plugin entry point."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from radixflow_sglang import launch_server as ls
from radixflow_sglang.config import SETTINGS
from radixflow_sglang.core.policy import POLICIES, policy_spec


def test_radixflow_flags_map_to_env_and_pass_sglang_args_through():
    launch = ls.parse(["--model-path", "m", "--radixflow-policy", "traversal",
                       "--radixflow-admission-ms", "7.5", "--radixflow-theta", "128",
                       "--tp", "2"], env={})
    assert launch.sglang_args == ["--model-path", "m", "--tp", "2"]
    env = ls.child_env(launch.config)
    from radixflow_sglang.config import config_from_env

    cfg = config_from_env({k: v for k, v in env.items() if v is not None})
    assert cfg == launch.config
    assert (cfg.policy, cfg.admission_ms, cfg.theta, cfg.frag_cap) == ("traversal", 7.5, 128, 2)
    assert env["RADIXFLOW_POLICY"] == "traversal"
    assert env["RADIXFLOW_ADMISSION_MS"] == "7.5" and env["RADIXFLOW_THETA"] == "128"
    assert env["RADIXFLOW_TRACE"] is None  # a stale variable in the launcher's env is unset


def test_child_env_unsets_stale_variables_and_makes_the_trace_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    launch = ls.parse(["--radixflow-trace", "t.jsonl"], env={})
    target = {"RADIXFLOW_THETA": "99", "OTHER": "x"}
    ls.apply_env(ls.child_env(launch.config), target)
    assert target["RADIXFLOW_TRACE"] == str(tmp_path / "t.jsonl")
    assert "RADIXFLOW_THETA" not in target and target["OTHER"] == "x"


@pytest.mark.parametrize("argv, needle", [
    (["--radixflow-policy", "fast"],
     "argument --radixflow-policy: invalid choice 'fast' (choose from stock, radix,"),
    (["--radixflow-admission-ms", "-1"],
     "argument --radixflow-admission-ms: -1 is outside the allowed range [0, 1000] ms"),
    (["--radixflow-admission-ms", "soon"], "'soon' is not a number"),
    (["--radixflow-executor", "gpu"], "invalid choice 'gpu' (choose from model, simulated)"),
    (["--radixflow-theta", "0"], "argument --radixflow-theta: 0 is outside the allowed range"),
    (["--radixflow-frag-cap", "x"], "argument --radixflow-frag-cap: 'x' is not an integer"),
    (["--radixflow-trace", "/no/such/dir/t.jsonl"],
     "argument --radixflow-trace: directory /no/such/dir does not exist"),
    (["--radixflow-polcy", "radix"], "unrecognized radixflow argument"),
    (["--radixflow-policy", "stock", "--radixflow-trace", "t.jsonl"],
     "error: --radixflow-trace is set but --radixflow-policy is stock, which runs SGLang's "
     "unmodified scheduler and writes no trace"),
])
def test_bad_flags_fail_naming_the_flag(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        ls.parse(argv, env={})
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("argv, env, needle", [
    ([], {"RADIXFLOW_THETA": "abc"}, "error: RADIXFLOW_THETA: 'abc' is not an integer"),
    (["--radixflow-policy", "stock"], {"RADIXFLOW_TRACE": "t.jsonl"},
     "error: RADIXFLOW_TRACE is set but --radixflow-policy is stock"),
    ([], {"RADIXFLOW_POLICY": "stock", "RADIXFLOW_TRACE": "t.jsonl"},
     "error: RADIXFLOW_TRACE is set but RADIXFLOW_POLICY is stock"),
])
def test_launcher_variables_are_checked_and_named_like_flags(argv, env, needle, capsys):
    with pytest.raises(SystemExit) as e:
        ls.parse(argv, env=env)
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_a_flag_wins_over_its_variable_and_a_variable_over_the_default():
    launch = ls.parse(["--radixflow-theta", "128"],
                      env={"RADIXFLOW_THETA": "abc", "RADIXFLOW_FRAG_CAP": "5"})
    assert (launch.config.theta, launch.config.frag_cap) == (128, 5)
    assert launch.sources == {"theta": "--radixflow-theta", "frag_cap": "RADIXFLOW_FRAG_CAP"}


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


def test_plugin_is_registered_off_by_default_and_stops_on_a_bad_policy(monkeypatch):
    from importlib.metadata import entry_points

    import sglang.srt.managers.scheduler as m

    from radixflow_sglang import plugin
    from radixflow_sglang.adapter import entry, validate

    eps = {e.name: e.value for e in entry_points(group="sglang.srt.plugins")}
    assert eps.get("radixflow") == "radixflow_sglang.plugin:register"
    monkeypatch.delenv("RADIXFLOW_POLICY", raising=False)
    plugin.register()
    assert m.Scheduler is entry._UPSTREAM_CLASS
    monkeypatch.setenv("RADIXFLOW_POLICY", "nope")
    with pytest.raises(SystemExit, match="RADIXFLOW_POLICY: invalid choice 'nope'"):
        plugin.register()
    monkeypatch.setenv("RADIXFLOW_POLICY", "radixflow")
    checks = validate.TokenizerManager._validate_one_request
    try:
        plugin.register()
        assert m.Scheduler.__name__ == "RadixFlowScheduler"
        assert validate.installed()
    finally:
        m.Scheduler = entry._UPSTREAM_CLASS
        validate.TokenizerManager._validate_one_request = checks


PLUGINS = ("from sglang.srt.plugins import load_plugins; load_plugins(); "
           "print('start-up went on')")


@pytest.mark.parametrize("var, value, needle", [
    ("RADIXFLOW_POLICY", "fast", "RADIXFLOW_POLICY: invalid choice 'fast' (choose from stock"),
    ("RADIXFLOW_THETA", "abc", "RADIXFLOW_THETA: 'abc' is not an integer"),
])
def test_sglang_load_plugins_cannot_swallow_a_bad_variable(var, value, needle):
    """SGLang's load_plugins logs and swallows a plugin's Exception (plugins/__init__.py); a
    bad variable must stop start-up instead, naming it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADIXFLOW_")}
    env.update({"RADIXFLOW_POLICY": "radixflow", var: value})
    r = subprocess.run([sys.executable, "-c", PLUGINS], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 1, r.stderr[-2000:]
    assert "start-up went on" not in r.stdout
    assert f"radixflow plugin: {needle}" in r.stderr and "not starting" in r.stderr


def test_the_plugin_says_when_radixflow_is_active_and_with_which_policy():
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADIXFLOW_")}
    env.update(RADIXFLOW_POLICY="traversal")
    r = subprocess.run([sys.executable, "-c", PLUGINS], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0 and "start-up went on" in r.stdout, r.stderr[-2000:]
    lines = [x for x in r.stderr.splitlines() if "RadixFlow active" in x]
    described = policy_spec("traversal").describe()
    assert "state-ready traversal" in described
    # NOTE: the plugin starts before SGLang reads the model: theta is its rule, not "default"
    settings = ("policy=traversal admission_ms=off theta=max(G,64) park_margin=1 frag_cap=2 "
                "trace=off boundaries=both chat_boundary=off drain_timeout=30.0 "
                "round_overhead_ms=measured arrival_rate=measured sim_profile=box "
                "sim_scan_tax_us=0.0")
    assert lines == [f"[radixflow] RadixFlow active (plugin): policy traversal: {described}; "
                     f"settings {settings}; request checks on"]


def test_launcher_cli_rejects_bad_policy_before_starting_anything():
    r = subprocess.run([sys.executable, "-m", "radixflow_sglang.launch_server",
                        "--radixflow-policy", "bogus"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "invalid choice 'bogus'" in r.stderr


@pytest.mark.parametrize("argv, needles", [
    # arg_groups/mamba_hook.py `validate_mamba_no_buffer`, in resolve_once
    (["--mamba-radix-cache-strategy", "no_buffer"],
     ["SGLang refuses these server arguments: ", "no_buffer do not support overlap",
      "add --disable-overlap-schedule"]),
    # arg_groups/validation_hook.py `check_server_args`, which upstream runs at launch
    (["--enable-priority-scheduling", "--schedule-policy", "lpm"],
     ["SGLang refuses these server arguments: ", "schedule_policy must be 'fcfs' or 'lof'"]),
    # SGLang's TP groups build NCCL communicators: on CPU every rank dies at start-up
    (["--radixflow-executor", "simulated", "--tp-size", "2"],
     ["--tp-size 2: the simulated executor runs on CPU", "use --dp-size N"]),
    (["--radixflow-executor", "simulated", "--pp-size", "2"],
     ["--pp-size 2: the simulated executor runs on CPU", "use --dp-size N"]),
    (["--radixflow-executor", "simulated", "--enable-hierarchical-cache"],
     ["--enable-hierarchical-cache: the simulated executor runs on CPU"]),
])
def test_arguments_sglang_cannot_serve_are_an_argument_error(argv, needles):
    """The launcher exits 2 with the reason (and the flags to change), no traceback."""
    r = subprocess.run([sys.executable, "-m", "radixflow_sglang.launch_server", *argv],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert all(n in r.stderr for n in needles), r.stderr[-1000:]


def test_launcher_help_lists_the_radixflow_flags_with_their_choices_and_sglangs():
    r = subprocess.run([sys.executable, "-m", "radixflow_sglang.launch_server", "--help"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout
    ours = out.index("RadixFlow arguments:")
    assert "--radixflow-policy {" + ",".join(POLICIES) + "}" in out
    assert "--radixflow-executor {model,simulated}" in out
    for s in SETTINGS:
        assert s.flag in out[ours:] and s.var in out
    sglang = out.index("server arguments")
    assert ours < sglang and "--model-path MODEL_PATH" in out[sglang:]
    assert "--chunked-prefill-size" in out[sglang:]


@pytest.mark.parametrize("model, page, theta, expected", [
    ("qwen3.5-0.8b", None, None, 64), ("nemotron-9b", None, None, 128),
    ("qwen3.5-0.8b", 128, None, 128), ("qwen3-8b", None, None, 64),
    ("qwen3.5-0.8b", None, 100, 100),
])
def test_the_start_up_line_prints_the_theta_the_scheduler_resolves(model, page, theta,
                                                                    expected):
    """runtime.py resolves theta = max(G, 64) from the scheduler's cache (G: lcm of the model's
    mamba chunk and the page; the page for full attention); the launcher's and the Engine's
    start-up line print the same from the resolved server args (it printed theta=default)."""
    from sglang.srt.server_args import ServerArgs

    from radixflow_sglang.adapter.entry import resolved_theta
    from radixflow_sglang.adapter.simulated import allow_extra_buffer_on_cpu
    from radixflow_sglang.config import RadixFlowConfig
    from radixflow_sglang.tokenizer import served_model_dir

    allow_extra_buffer_on_cpu()
    server_args = ServerArgs(model_path=str(served_model_dir(model)), load_format="dummy",
                             device="cpu", context_length=8192, page_size=page)
    server_args.resolve_once()
    cfg = RadixFlowConfig(theta=theta)
    assert resolved_theta(cfg, server_args) == expected
    line = cfg.describe_settings({"theta": resolved_theta(cfg, server_args)})
    assert f" theta={expected} " in line and "default" not in line
