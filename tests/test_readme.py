"""The README's set-up commands, policy table and flags match the code (issue: harden item 6):
the commands are scripts/run.sh's and .ci/run runs the test one; the composition table names
every policy once; the flags it names are exactly the launcher's `--radixflow-*` arguments,
and it claims a RADIXFLOW_* variable only for a setting that has one."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section(title: str) -> str:
    start = README.index(f"\n## {title}")
    end = README.find("\n## ", start + 1)
    return README[start:end if end >= 0 else None]


def test_the_setup_commands_are_run_sh_cases_and_ci_runs_the_test_one():
    block = re.search(r"```bash\n(.*?)```", README, re.S).group(1)
    cmds = [line.split("#")[0].split() for line in block.splitlines() if line.strip()]
    assert cmds == [["bash", "scripts/run.sh", "serve"], ["bash", "scripts/run.sh", "test"]]
    run_sh = (ROOT / "scripts" / "run.sh").read_text(encoding="utf-8")
    assert all(re.search(rf"^\s+{c[2]}\)", run_sh, re.M) for c in cmds)
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r"^bash scripts/run\.sh test$", ci, re.M)


def test_the_policy_table_names_every_policy_once():
    from radixflow_sglang.core.policy import POLICIES

    rows = [line for line in section("Policies").splitlines() if line.startswith("| `")]
    named = [n for row in rows for n in re.findall(r"`([a-z0-9-]+)`", row.split("|")[1])]
    assert sorted(named) == sorted(POLICIES)


def test_the_flags_are_the_launchers():
    from radixflow_sglang.config import LAUNCHER_SETTINGS, SETTINGS
    from radixflow_sglang.launch_server import parser

    flags = {o for a in parser()._actions for o in a.option_strings}
    ours = {f for f in flags if f.startswith("--radixflow-")}
    named = set(re.findall(r"--radixflow-[a-z-]*[a-z]", README)) - {"--radixflow-x-y"}
    assert named == ours  # NOTE: --radixflow-x-y is the naming rule's placeholder
    assert ours == {s.flag for s in SETTINGS + LAUNCHER_SETTINGS}
    # a launcher-only setting has no variable: the README says so next to the contract
    for s in LAUNCHER_SETTINGS:
        assert f"`{s.flag}` is the launcher's own (no variable" in README
        assert s.flag.replace("--", "").replace("-", "_").upper() not in README
