"""eval/ablation.py's bookkeeping (pure): what an ablated arm changed, and the per-rule verdict;
its flags name the rule list it takes. The twin runs themselves: `python -m eval.ablation`."""

from __future__ import annotations

import pytest

from eval import ablation

BASE = {"latency_mean_s": 1.0, "latency_p95_s": 2.0, "rounds": 5, "scheduled_tokens": 100}


def test_changed_names_each_figure_that_moved_and_failures():
    assert ablation.changed(BASE, dict(BASE)) is None
    assert ablation.changed(BASE, {"skipped": True}) is None  # NOTE: never fired: baseline's
    assert ablation.changed(BASE, {**BASE, "rounds": 6}) == {"rounds": (5, 6)}
    assert ablation.changed(BASE, {"failed": True, "error": "X"}) == {"failed": "X"}


def test_a_rule_changes_nothing_only_when_no_run_moved():
    results = [{"cell": "c", "policy": "p", "baseline": BASE, "decisions": {"fits": 2},
                "arms": {"fits": dict(BASE), "move": {**BASE, "latency_mean_s": 0.9}}}]
    v = ablation.verdicts(results, ["fits", "move"])
    assert v["fits"]["changes_nothing"] and v["fits"]["decisions"] == 2
    assert not v["move"]["changes_nothing"] and v["move"]["changed_runs"] == 1
    assert "0.900x" in ablation.table(results, v)


def test_unknown_rules_are_refused_naming_the_allowed(capsys):
    with pytest.raises(SystemExit):
        ablation.main(["--out", "/nonexistent", "--rules", "nope"])
    assert "ablatable rules: early, deadline" in capsys.readouterr().err
