"""The host-time what-if: --radixflow-sim-scan-tax-us (adapter/simulated.py `scan_tax`) and
eval/whatif_arm.py, which runs it (or radixflow untraced) in live_ab's third arm."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from eval import whatif_arm
from radixflow_sglang.config import ConfigError, config_from_env

sim = pytest.importorskip("radixflow_sglang.adapter.simulated")


class CpuClock:
    """A thread CPU clock that advances `step` seconds per reading (the spin's only input)."""

    def __init__(self, step: float) -> None:
        self.now, self.step, self.reads = 0.0, step, 0

    def __call__(self) -> float:
        self.reads += 1
        self.now += self.step
        return self.now


def test_the_tax_spends_its_cpu_before_a_scan_with_work_queued_and_none_on_an_empty_queue(
        make_kit):
    kit = make_kit(policy="stock")
    calls = []
    clock = CpuClock(step=0.0001)
    taxed = sim.scan_tax(lambda self, running: calls.append((self, running)) or "plan", 0.001,
                         cpu=clock)
    sched = kit.sched
    assert not sched.waiting_queue
    assert taxed(sched, "running") == "plan"
    assert clock.reads == 0  # NOTE: an idle pass pays nothing
    kit.submit(kit.req("a", list(range(1, 65))))
    assert sched.waiting_queue
    assert taxed(sched, "running") == "plan"
    # NOTE: spun until 1 ms of CPU more than at entry: 0.1 ms a reading, 10 readings past it
    assert clock.now >= 0.001 + 0.0001 and clock.reads == 11
    assert calls == [(sched, "running"), (sched, "running")]


def test_the_tax_is_a_checked_setting_with_a_flag_and_a_variable():
    assert config_from_env({}).sim_scan_tax_us == 0.0
    assert config_from_env({"RADIXFLOW_SIM_SCAN_TAX_US": "900"}).sim_scan_tax_us == 900.0
    with pytest.raises(ConfigError, match="RADIXFLOW_SIM_SCAN_TAX_US"):
        config_from_env({"RADIXFLOW_SIM_SCAN_TAX_US": "-1"})


def test_the_arm_names_and_their_errors():
    assert whatif_arm.parse_as("stock-tax:900") == ("stock-tax-900us", 900.0)
    assert whatif_arm.parse_as("radixflow-untraced") == ("radixflow-untraced", None)
    for bad in ("stock-tax", "stock-tax:0", "stock-tax:x", "lpm"):
        with pytest.raises(argparse.ArgumentTypeError, match="radixflow-untraced"):
            whatif_arm.parse_as(bad)


STOCK_LPM = ["py", "-m", "radixflow_sglang.launch_server", "--radixflow-policy", "stock",
             "--model-path", "m", "--schedule-policy", "lpm", "--port", "1"]
RADIXFLOW = ["py", "-m", "radixflow_sglang.launch_server", "--radixflow-policy", "radixflow",
             "--radixflow-trace", "t.jsonl", "--model-path", "m", "--port", "1"]


def test_the_what_if_commands_replace_the_third_arms():
    taxed = whatif_arm.whatif_cmd(STOCK_LPM, RADIXFLOW, 900.0)
    assert "--schedule-policy" not in taxed and "lpm" not in taxed
    assert taxed[-2:] == ["--radixflow-sim-scan-tax-us", "900"]
    assert taxed[:5] == STOCK_LPM[:5]
    untraced = whatif_arm.whatif_cmd(STOCK_LPM, RADIXFLOW, None)
    assert untraced == ["py", "-m", "radixflow_sglang.launch_server", "--radixflow-policy",
                        "radixflow", "--model-path", "m", "--port", "1"]
    sglang = ["py", "-m", "sglang.launch_server", "--schedule-policy", "lpm"]
    with pytest.raises(SystemExit, match="stock-cmd radixflow"):
        whatif_arm.whatif_cmd(sglang, RADIXFLOW, 900.0)


def test_the_report_names_the_what_if_arm_and_no_lpm_is_refused(capsys):
    text = ("# Live A/B: stock vs radixflow (and stock-lpm)\n\n"
            "| metric | stock median | stock-lpm median | stock-lpm/stock [95% CI] |\n")
    out = whatif_arm.relabel(text, "stock-tax-900us", "python -m eval.whatif_arm --as x")
    assert out.splitlines() == [
        "# Live A/B: stock vs radixflow (and stock-tax-900us)", "",
        "What-if: the `stock-tax-900us` arm ran in live_ab's stock-lpm slot "
        "(`python -m eval.whatif_arm --as x`; eval/whatif_arm.py).", "",
        "| metric | stock median | stock-tax-900us median | stock-tax-900us/stock [95% CI] |"]
    with pytest.raises(SystemExit):
        whatif_arm.main(["--as", "stock-tax:900", "--no-lpm", "--out", "x"])
    assert "--no-lpm" in capsys.readouterr().err


def test_a_run_relabels_only_the_reports_it_wrote_and_runs_no_twin(tmp_path, monkeypatch):
    from eval import live_ab, run_arms

    monkeypatch.setattr(run_arms, "server_cmd", run_arms.server_cmd)  # NOTE: restored after
    stale = tmp_path / "old" / "report.md"
    stale.parent.mkdir()
    stale.write_text("# an older run\n\nstock-lpm\n")
    os.utime(stale, (0, 0))
    seen = []

    def fake_main(argv):
        seen.append(argv)
        (tmp_path / "report.md").write_text("# Live A/B (and stock-lpm)\n\n| stock-lpm |\n")
        return 0

    monkeypatch.setattr(live_ab, "main", fake_main)
    argv = ["--as", "stock-tax:900", "--out", str(tmp_path), "--twin"]
    assert whatif_arm.main(argv) == 0
    assert seen[0][-1] == "--no-twin"
    assert "stock-tax-900us" in (tmp_path / "report.md").read_text()
    assert stale.read_text() == "# an older run\n\nstock-lpm\n"
    info = json.loads((tmp_path / "whatif.json").read_text())
    assert info["arm"] == "stock-tax-900us" and info["scan_tax_us"] == 900.0
