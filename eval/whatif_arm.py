"""A what-if arm in `eval.live_ab`'s third slot: its ABBA series (stock, radixflow, third) with
the third arm, stock-lpm, replaced by one of

* `stock-tax:US`: stock with `--radixflow-sim-scan-tax-us US` (the simulated executor spends
  US microseconds of scheduler CPU before each prefill scan with work queued): what that much
  more host time per scan costs on this host, beside radixflow's own in the same series;
* `radixflow-untraced`: radixflow without `--radixflow-trace`, as a production server runs
  (every live_ab radixflow arm traces, for the twin; stock writes no trace).

    python -m eval.whatif_arm --as stock-tax:900 --out OUT --profiles box --repeat 3 \\
        --workloads sibling-after-completion --server-args "--mamba-radix-cache-strategy no_buffer"

Every other flag is live_ab's. The twin is off (it would price stock-lpm); the reports'
stock-lpm rows are relabelled with the arm (report.md, and profiles.md with several
--profiles), and OUT/whatif.json records what it ran.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from eval import live_ab, run_arms
from eval.ab_report import LPM
from radixflow_sglang.config import SETTINGS, ConfigError

KINDS = ("stock-tax:US", "radixflow-untraced")
TAX = next(s for s in SETTINGS if s.field == "sim_scan_tax_us")


def parse_as(text: str) -> tuple[str, float | None]:
    """`--as` -> (arm name, tax in us or None); errors name the flag and the allowed values."""
    if text == "radixflow-untraced":
        return text, None
    kind, _, us = text.partition(":")
    if kind == "stock-tax":
        try:
            tax = TAX.parse(us)  # NOTE: the setting's own number and range check
        except ConfigError:
            tax = 0.0
        if tax > 0:  # NOTE: a tax of 0 is no what-if
            return f"stock-tax-{tax:g}us", tax
    raise argparse.ArgumentTypeError(
        f"{text!r}: choose from {', '.join(KINDS)} (US: microseconds, 0 < US <= {TAX.high:g})")


def whatif_cmd(cmd: list[str], radixflow_cmd: list[str], tax: float | None) -> list[str]:
    """The what-if arm's server command, from live_ab's stock-lpm command (`cmd`) and its
    radixflow one: stock without lpm plus the tax, or radixflow without its trace."""
    if tax is None:
        i = radixflow_cmd.index("--radixflow-trace")
        return radixflow_cmd[:i] + radixflow_cmd[i + 2:]
    if "radixflow_sglang.launch_server" not in cmd:
        raise SystemExit("python -m eval.whatif_arm: error: --as stock-tax needs the simulated "
                         "executor's stock (--stock-cmd radixflow), not SGLang's launcher")
    i = cmd.index("--schedule-policy")
    return [*cmd[:i], *cmd[i + 2:], TAX.flag, f"{tax:g}"]


def relabel(text: str, name: str, command: str) -> str:
    """A report with the what-if arm's name where live_ab wrote stock-lpm's, and a line under
    its title saying what that arm ran."""
    head, sep, rest = text.replace(LPM, name).partition("\n")
    return (f"{head}{sep}\nWhat-if: the `{name}` arm ran in live_ab's {LPM} slot "
            f"(`{command}`; eval/whatif_arm.py).\n{rest}")


def install(tax: float | None) -> None:
    """run_arms.server_cmd with the what-if command for the stock-lpm arm."""
    upstream = run_arms.server_cmd

    def server_cmd(spec: run_arms.ArmSpec, stock_cmd: str, common: list[str], trace: Path,
                   profile: str | None = None) -> list[str]:
        cmd = upstream(spec, stock_cmd, common, trace, profile)
        if spec.name != LPM:
            return cmd
        radixflow = upstream(run_arms.ArmSpec("radixflow", "radixflow"), stock_cmd, common,
                             trace, profile)
        return whatif_cmd(cmd, radixflow, tax)

    run_arms.server_cmd = server_cmd


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m eval.whatif_arm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--as", dest="arm", type=parse_as, required=True,
                   help=f"the third arm: {' or '.join(KINDS)}")
    args, rest = p.parse_known_args(argv)
    if "--no-lpm" in rest:
        p.error("--no-lpm: the what-if arm takes the stock-lpm arm's slot; drop --no-lpm")
    name, tax = args.arm
    rest = [*rest, "--no-twin"]  # NOTE: the last of --twin / --no-twin wins
    install(tax)
    started = time.time()
    rc = live_ab.main(rest)
    out = Path(live_ab.build_parser().parse_known_args(rest)[0].out)
    command = ["python", "-m", "eval.whatif_arm", *(sys.argv[1:] if argv is None else argv)]
    # NOTE: the reports this run wrote (each profile's report.md, profiles.md), not an older
    # run's left in OUT
    for report in out.rglob("*.md"):
        if report.stat().st_mtime >= started:
            report.write_text(relabel(report.read_text(), name, shlex.join(command)))
    (out / "whatif.json").write_text(json.dumps(
        {"arm": name, "replaces": LPM, "scan_tax_us": tax, "untraced": tax is None,
         "command": command}, indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main())
