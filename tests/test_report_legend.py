"""The reports define a question's latency for any branch count (issue: harden item 4): the
twin's and the live report's legends say 'last branch', as twin.QuestionRecord and
client.py measure it (arrival / send -> the question's last branch done)."""

from __future__ import annotations

from eval import arms_report, report


def legend(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("Latency = "))


def test_the_twin_report_defines_latency_by_the_last_branch():
    line = legend(report.render_markdown({}, {}, []))
    assert "last branch" in line and "4th" not in line


def test_the_live_report_defines_latency_by_the_last_branch(tmp_path):
    arms_report.write_outputs(tmp_path, {}, {}, 1.0)
    line = legend((tmp_path / "report.md").read_text())
    assert "last branch" in line and "4th" not in line
