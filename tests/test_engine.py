"""RadixFlow inside SGLang's offline engine: `radixflow_sglang.Engine` (adapter/engine.py) on CPU.

Each layout runs radixflow_sglang/testing/engine_run.py in its own process (SGLang's Engine
spawns its schedulers and its shutdown() kills every child of its process): a stock engine,
then a radixflow one, each with the witness executor, through an RL-style rollout (prompts
sharing a system prompt, repeated samples in one synchronous batch of input ids; SGLang's own
n on text through async_generate). Sizes are small; the full size is `python -m
radixflow_sglang.testing.engine_run --layout L --prompts 16 --samples 8 --output-len 64
--system-len 1000 --out F` (or `python examples/compare.py [--expand]`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = ("extra_buffer", "no_buffer")
PHASES = ("expanded", "parallel")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Both layouts' runs, started together (each mostly waits on its engines' start-up)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADIXFLOW_")}
    procs = {}
    for layout in LAYOUTS:
        out = tmp_path_factory.mktemp(layout) / "run.json"
        cmd = [sys.executable, "-m", "radixflow_sglang.testing.engine_run", "--layout", layout,
               "--out", str(out)]
        procs[layout] = (out, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, text=True,
                                               start_new_session=True))
    done = {}
    for layout, (out, proc) in procs.items():
        try:
            _, err = proc.communicate(timeout=1800)  # NOTE: a hang bound
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # NOTE: its engines' processes too
            _, err = proc.communicate()
        done[layout] = (proc.returncode, out, err)
    return done


@pytest.fixture(params=LAYOUTS)
def run(request, runs):
    rc, out, err = runs[request.param]
    assert rc == 0, err[-4000:]
    return request.param, json.loads(out.read_text()), err


@pytest.mark.slow
def test_outputs_equal_stocks_and_the_witness_finds_no_mismatch(run):
    _, arms, _ = run
    for phase in PHASES:
        stock, rf = (arms[p]["phases"][phase] for p in ("stock", "radixflow"))
        assert stock["requests"] == rf["requests"] == 16
        assert rf["outputs"] == stock["outputs"], phase
        assert all(len(o) == 8 for o in rf["outputs"])
    for arm in arms.values():
        w = arm["witness"]
        # NOTE: 16 + 16 samples and 4 n > 1 warm-ups, every one checked
        # NOTE: + the good request after the bad batch
        assert w["requests"] == w["verified"] == 37 and w["mismatched"] == 0


@pytest.mark.slow
def test_radixflow_computes_fewer_prefill_tokens_on_a_batch_of_repeated_prompts(run):
    layout, arms, _ = run
    stock, rf = (arms[p]["phases"]["expanded"]["prefill_tokens"] for p in ("stock", "radixflow"))
    assert rf < stock, (layout, rf, stock)
    if layout == "no_buffer":  # NOTE: extra_buffer's n > 1: the next test
        stock, rf = (arms[p]["phases"]["parallel"]["prefill_tokens"]
                     for p in ("stock", "radixflow"))
        assert rf < stock, (layout, rf, stock)


@pytest.mark.slow
def test_n_samples_warm_ups_keep_sglangs_fork_checkpoint(run):
    """SGLang's n > 1 warm-up declares length - 1 implicitly; where its match carries SGLang's
    branching depth (the system prompt's fork) that checkpoint wins (adapter/boundary.py
    `declared_boundary`). When the warm-up's boundary replaced it, later warm-ups recomputed
    the system prompt: 2.1x stock's prefill tokens at 16 prompts x n 8 with extra_buffer."""
    layout, arms, _ = run
    stock, rf = (arms[p]["phases"]["parallel"]["prefill_tokens"] for p in ("stock", "radixflow"))
    assert rf <= stock, (layout, rf, stock)


@pytest.mark.slow
def test_server_info_carries_the_radixflow_and_witness_sections(run):
    _, arms, _ = run
    assert arms["stock"]["radixflow"] is None  # NOTE: SGLang's own scheduler class
    section = arms["radixflow"]["radixflow"]
    assert section["policy"] == "radixflow" and section["settings"]["theta"] == 64
    assert section["wait_set"] == 0 and section["rounds"] > 0
    assert all(arm["witness"]["states_checked"] > 0 for arm in arms.values())


@pytest.mark.slow
def test_no_slot_leaks_and_shutdown_leaves_no_process(run):
    _, arms, _ = run
    for arm in arms.values():
        assert arm["pools"] == {"idle": True, "leak": False, "messages": []}
        assert arm["children_after_shutdown"] == []


@pytest.mark.parametrize("kwargs, env, needle", [
    ({"radixflow_theta": 0}, {},
     "radixflow_theta: 0 is outside the allowed range [1, 1048576]"),
    ({"radixflow_policy": "fast"}, {},
     "radixflow_policy: invalid choice 'fast' (choose from stock, radix,"),
    ({}, {"RADIXFLOW_ADMISSION_MS": "soon"}, "RADIXFLOW_ADMISSION_MS: 'soon' is not a number"),
    ({"radixflow_executor": "gpu"}, {},
     "radixflow_executor: invalid choice 'gpu' (choose from model, simulated)"),
    ({"radixflow_policy": "stock", "radixflow_trace": "t.jsonl"}, {},
     "radixflow_trace is set but radixflow_policy is stock"),
])
def test_a_bad_setting_fails_construction_naming_it(kwargs, env, needle, monkeypatch):
    import psutil

    from radixflow_sglang import Engine
    from radixflow_sglang.config import ConfigError

    for k in [k for k in os.environ if k.startswith("RADIXFLOW_")]:
        monkeypatch.delenv(k)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    before = {p.pid for p in psutil.Process().children()}
    with pytest.raises(ConfigError) as e:
        Engine(**kwargs)
    assert needle in str(e.value)
    assert {p.pid for p in psutil.Process().children()} == before  # nothing was started


def test_model_parallelism_on_the_simulated_executor_fails_before_any_process_starts():
    """SGLang 0.5.23 builds NCCL communicators for TP groups, on CPU too: the spawned ranks
    died with a CUDA error (launch_server.py `cpu_limit`, here with keyword names)."""
    import psutil

    from radixflow_sglang import Engine

    before = {p.pid for p in psutil.Process().children()}
    with pytest.raises(ValueError, match=r"^tp_size 2: the simulated executor runs on CPU.*"
                                         r"use dp_size N"):
        Engine(radixflow_executor="simulated", tp_size=2)
    assert {p.pid for p in psutil.Process().children()} == before


def test_an_unknown_radixflow_keyword_lists_the_known_ones():
    from radixflow_sglang import Engine

    with pytest.raises(TypeError, match=r"unknown RadixFlow keyword 'radixflow_polcy' \(choose "
                                        r"from radixflow_policy, radixflow_admission_ms"):
        Engine(radixflow_polcy="radix")


def test_keywords_win_over_variables_and_reach_the_children_through_them():
    from radixflow_sglang.adapter.engine import spawn_env
    from radixflow_sglang.config import config_from_env, config_from_kwargs

    cfg, executor = config_from_kwargs({"radixflow_theta": 128, "radixflow_executor": "simulated",
                                        "mem_fraction_static": 0.5},
                                       {"RADIXFLOW_THETA": "abc", "RADIXFLOW_FRAG_CAP": "5"})
    assert (cfg.theta, cfg.frag_cap, executor) == (128, 5, "simulated")
    env = spawn_env(cfg, executor, ranks=1)
    assert config_from_env({k: v for k, v in env.items() if v is not None}) == cfg
    assert env["RADIXFLOW_TRACE"] is None  # NOTE: a stale variable is unset for the children


@pytest.mark.slow
def test_a_bad_batch_item_is_named_and_the_engine_serves_on(run):
    _, arms, _ = run
    for arm in arms.values():
        bad = arm["bad_batch"]
        vocab = bad["vocab"]
        assert bad["error"] == (f"batch item 1: top_logprobs_num: {vocab + 1} is above the "
                                f"vocabulary size {vocab}; allowed: an integer in [0, {vocab}]")
        assert len(bad["after"]) == 2


@pytest.mark.slow
def test_each_engine_says_it_is_active_with_the_resolved_settings(run):
    _, _, stderr = run
    lines = [x for x in stderr.splitlines() if "RadixFlow active (Engine" in x]
    assert [x.split("policy ")[1].split(":")[0] for x in lines] == ["stock", "radixflow"]
    for line in lines:
        assert "(Engine, executor simulated)" in line and " theta=64 " in line
        assert "=default" not in line and "round_overhead_ms=measured" in line


@pytest.mark.slow
def test_the_simulated_executor_samples_deterministically_as_the_readme_says(run):
    """A user comparing n samples must not think sampling is broken: the README says they are
    identical under the simulated executor, and they are (temperature 1.0, n = 4)."""
    _, arms, _ = run
    outs = arms["radixflow"]["phases"]["parallel"]["outputs"]
    groups = [outs[i:i + 4] for i in range(0, len(outs), 4)]
    assert all(g == [g[0]] * 4 for g in groups) and len({str(g[0]) for g in groups}) == 4
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "The simulated executor samples deterministically" in readme
    assert "the `n` samples of one prompt (or one prompt sent n times) are identical" in readme
