"""A tiny soak (eval/soak.py): the CLI writes soak.json; no leak, no stale COW, bounded waits."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from eval import soak

POLICIES = ["stock", "radixflow"]


@pytest.fixture(scope="module")
def doc(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("soak")
    rc = soak.main(["--requests", "300", "--out", str(out), "--policies", ",".join(POLICIES),
                    "--no-progress"])
    assert rc == 0
    return json.loads((Path(out) / "soak.json").read_text())


def test_soak_json_has_every_key_per_policy(doc: dict) -> None:
    assert list(doc["policies"]) == POLICIES
    for res in doc["policies"].values():
        missing = [k for k in soak.SOAK_KEYS if k not in res]
        assert missing == []
    assert doc["config"]["requests"] == 300


@pytest.mark.parametrize("policy", POLICIES)
def test_tiny_soak_has_no_leak_and_no_stale_copy_on_write_source(doc: dict, policy: str) -> None:
    res = doc["policies"][policy]
    assert res["requests"] == 300
    assert res["completed"] + res["aborted"] == 300
    assert res["aborted"] > 0  # the soak does abort queued requests
    assert (res["leaked_kv_slots"], res["leaked_mamba_slots"], res["leaked_rows"]) == (0, 0, 0)
    assert res["stale_cow_sources"] == 0
    assert res["violations"] == 0, res["violation_examples"]
    assert res["longest_wait_rounds"] <= res["park_bound"]
    assert res["peak_kv_used"] > 0.5 * res["kv_tokens"]  # the pool is tight
    assert res["scan_cpu_ms_per_round_first_decile"] > 0


def test_traversal_parks_in_the_soak(doc: dict) -> None:
    assert doc["policies"]["radixflow"]["blocked"] > 0
    assert doc["policies"]["stock"]["blocked"] == 0


def test_overlap_soak_with_retractions_is_clean(tmp_path: Path) -> None:
    arrivals = soak.soak_workload(200, rate=150.0, seed=3)
    cfg = soak.SoakConfig(overlap=True, retract_prob=0.2, seed=3)
    res = soak.run_policy("traversal", arrivals, cfg)
    assert res["retracted"] > 0
    assert res["completed"] + res["aborted"] == 200
    assert res["violations"] == 0, res["violation_examples"]
    assert (res["leaked_kv_slots"], res["leaked_mamba_slots"], res["stale_cow_sources"]) == (0,
                                                                                            0, 0)


def test_no_buffer_outputs_run_at_the_minimum_mamba_pool() -> None:
    """Decoding rows hold their slots and copy-on-write sources while a chunked request's
    checkpoint needs a fresh slot: the minimum (harness.mamba_slots_for) counts it. One slot
    fewer, SGLang's own checkpoint asserts ("Can not alloc mamba cache") once a chunk ends
    while the pool is full: radix (stock + boundary cuts, no parking) alike; stock, whose
    prompts here rarely chunk, did not meet it."""
    arrivals = soak.soak_workload(100, rate=150.0, seed=0)
    cfg = soak.SoakConfig(layout="no_buffer", max_new_tokens=16)
    res = soak.run_policy("radixflow", arrivals, cfg)
    assert res["mamba_slots"] == 2 * cfg.rows + 1
    assert res["completed"] + res["aborted"] == 100 and res["violations"] == 0
    assert res["witness_verified"] == res["completed"]
    with pytest.raises(AssertionError, match="Can not alloc mamba cache"):
        soak.run_policy("radixflow", arrivals, replace(cfg, mamba_slots=2 * cfg.rows))


@pytest.mark.parametrize("argv, needle", [
    (["--policies", "nope"], "invalid choice: 'nope'"),
    (["--requests", "0"], "must be > 0"),
    (["--abort-frac", "1.5"], "must lie in [0, 1]"),
])
def test_bad_arguments_exit_2_naming_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 argv: list[str], needle: str) -> None:
    with pytest.raises(SystemExit) as e:
        soak.main(["--out", str(tmp_path), *argv])
    assert e.value.code == 2
    assert needle in capsys.readouterr().err


def test_overlap_with_no_buffer_is_refused(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert soak.main(["--out", str(tmp_path), "--overlap", "--layout", "no_buffer"]) == 2
    assert "--overlap needs --layout extra_buffer" in capsys.readouterr().err
