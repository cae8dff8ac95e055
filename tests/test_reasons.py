"""Every decision names its rule: the rulebook (core/reasons.py) orders the rules, the runtime
counts each visit and defer decision by its reason (/server_info `radixflow.reasons`), and the
trace's park / defer / decide events carry it. On SGLang's real classes (the kit)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from radixflow_sglang.config import RadixFlowConfig
from radixflow_sglang.core.reasons import POINTS, RULEBOOK, Action, Reason, rulebook_table, rules
from radixflow_sglang.testing.fixtures import toks

DOC = toks(1000, 2000)  # 2,000 shared tokens


def test_every_reason_is_one_rule_and_points_keep_their_order():
    assert sorted(why for r in RULEBOOK for why in r.reasons) == sorted(Reason)
    assert [r.point for r in RULEBOOK] == sorted((r.point for r in RULEBOOK), key=POINTS.index)
    assert rules("hold")[-1].reason is Reason.HOLD and rules("hold")[-1].action is Action.HOLD


def spied(kit) -> Counter:
    """Count the runtime's decision calls (park, defer) as SGLang's scan makes them."""
    calls: Counter = Counter()
    rt = kit.runtime
    for name in ("park", "defer"):
        real = getattr(rt, name)

        def spy(*a, _real=real, _name=name):
            calls[_name] += 1
            return _real(*a)

        setattr(rt, name, spy)
    return calls


@pytest.mark.parametrize("policy, consumer", [("traversal-always", Reason.ALWAYS_WAIT),
                                              ("radixflow-always", Reason.ALWAYS_WAIT),
                                              ("radix", Reason.NO_TRAVERSAL)])
def test_reason_counts_sum_to_the_decisions_made(make_kit, tmp_path, policy, consumer):
    trace = tmp_path / "trace.jsonl"
    k = make_kit(policy=policy, radixflow_config=RadixFlowConfig(policy=policy,
                                                                 trace=str(trace)))
    calls = spied(k)
    k.submit(k.req("P", DOC + toks(5000, 100)), k.req("A", DOC + toks(6000, 120)),
             k.req("D", toks(20_000, 300)))
    k.drain()
    counts = k.runtime.summary()["reasons"]
    assert sum(counts.values()) == calls["park"] + calls["defer"] > 0
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    decisions = [e for e in events if e["event"] in ("park", "defer")]
    assert Counter(e["reason"] for e in decisions) == Counter(counts)
    first_a = next(e for e in decisions if e["rid"] == "A" and e["event"] == "park")
    assert first_a["reason"] == consumer
    if consumer is Reason.ALWAYS_WAIT:
        assert first_a["action"] == Action.PARK
        assert counts[Reason.NO_PRODUCER] >= 1  # P: the scan's first visit, nothing indexed


def test_cost_aware_verdicts_name_their_rule(make_kit, tmp_path):
    trace = tmp_path / "trace.jsonl"
    k = make_kit(policy="radixflow", radixflow_config=RadixFlowConfig(policy="radixflow",
                                                                      trace=str(trace)))
    k.submit(k.req("P", DOC + toks(5000, 100)), k.req("A", DOC + toks(6000, 120)))
    k.drain()
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    decide = [e for e in events if e["event"] == "decide"]
    assert decide and all(e["reason"] in {r.reason.value for r in rules("visit")} for e in decide)
    for e in decide:  # NOTE: the verdict's outcome matches its rule's action
        rule = next(r for r in RULEBOOK if r.reason == e["reason"])
        assert e["wait"] == (rule.action is Action.PARK)


def test_design_doc_lists_the_rulebook_in_order():
    """docs/design.md's rulebook table: the same rules, names, actions and order as the code,
    before any other section."""
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "design.md").read_text()
    sections = [line for line in doc.splitlines() if line.startswith("## ")]
    assert sections[0].startswith("## The rulebook")
    page = doc.split("## The rulebook", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:-1] for line in page.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().isdigit()]
    got = [(c[1].strip(), c[2].strip().strip("`"), c[3].strip()) for c in rows]
    assert got == [(r.point, r.reason.value, r.action.value) for r in RULEBOOK]
    assert rulebook_table() in page  # NOTE: `python -m radixflow_sglang.explain --rulebook`


def reasons_in_order(fn) -> list[Reason]:
    """The `Reason.X` a decision function names, in source order (each once), with the reasons
    of a same-module function it calls spliced in where it calls it."""
    import ast
    import inspect
    import textwrap

    mod = inspect.getmodule(fn)
    out: list[Reason] = []

    def walk(node):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "Reason":
            if Reason[node.attr] not in out:
                out.append(Reason[node.attr])
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and inspect.isfunction(callee := getattr(mod, node.func.id, None)) \
                and callee.__module__ == mod.__name__:
            for r in reasons_in_order(callee):
                if r not in out:
                    out.append(r)
        for child in ast.iter_child_nodes(node):
            walk(child)

    walk(ast.parse(textwrap.dedent(inspect.getsource(fn))))
    return out


def test_the_rulebook_reads_the_decision_functions_rules_in_their_order():
    """The table is the code's shape: VISIT's rows are core/points.py `visit`'s rules (its
    wait rule's spliced in where it asks it), DEFER's `defer`'s, in the order the functions
    apply them, each rule's cases asked there too."""
    from radixflow_sglang.core.points import defer, visit
    from radixflow_sglang.core.reasons import RULES

    for fn, point in ((visit, "visit"), (defer, "defer")):
        named = reasons_in_order(fn)
        # NOTE: a rule's own reason stands in its place; a case (a fast path may be asked
        # first) is checked to be there at all
        assert [why for why in named if RULES[why].reason is why] == \
            [r.reason for r in rules(point)]
        assert {c for r in rules(point) for c in r.cases} <= set(named)


def test_guards_and_defaults_are_not_ablatable():
    from radixflow_sglang.core.reasons import parse_ablate

    guards = {r.reason for r in RULEBOOK if r.guard}
    assert guards == {Reason.NO_TRAVERSAL, Reason.NOT_BLOCKED, Reason.NO_CUT, Reason.OUTSIDE,
                      Reason.FORK_SLOT}
    for reason in guards:
        with pytest.raises(ValueError, match="a guard"):
            parse_ablate(reason.value)
