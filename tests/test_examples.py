"""The examples under examples/ run, at their smoke-test size (`--small`), so they cannot rot:
each is started as a user would (`python examples/X.py`) and its JSON line is checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def run_example(name: str, *args: str, cwd: Path = ROOT) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADIXFLOW_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], cwd=cwd, env=env,
                       capture_output=True, text=True, timeout=1200)
    assert r.returncode == 0, r.stderr[-4000:]
    return [json.loads(x) for x in r.stdout.splitlines() if x.startswith("{")]


def test_the_rl_rollout_example_runs_n_samples_per_prompt():
    [out] = run_example("rl_rollout.py", "--small")
    assert out["policy"] == "radixflow" and out["samples"] == 4 * 4
    assert out["output_tokens"] == 4 * 4 * 8 and out["witness_mismatched"] == 0
    assert out["radixflow"]["rounds"] > 0


def test_the_comparison_example_shows_identical_outputs_and_fewer_tokens():
    stock, rf, verdict = run_example("compare.py", "--small", "--expand")
    assert (stock["policy"], rf["policy"]) == ("stock", "radixflow")
    assert verdict["outputs_identical"] is True
    assert rf["prefill_tokens"] < stock["prefill_tokens"]
    assert verdict["ratio_radixflow_over_stock"]["prefill_tokens"] == round(
        rf["prefill_tokens"] / stock["prefill_tokens"], 4)
    assert stock["witness_mismatched"] == rf["witness_mismatched"] == 0


def test_the_frontend_fork_example_answers_every_branch(tmp_path):
    [out] = run_example("frontend_fork.py", "--launch", "--small", "--log",
                        str(tmp_path / "server.log"), cwd=tmp_path)
    assert out["programs"] == 2 and out["answers"] == 2 * 3
    assert out["radixflow"]["policy"] == "radixflow" and out["witness_mismatched"] == 0
