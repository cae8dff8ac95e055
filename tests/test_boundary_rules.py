"""Boundary publication names its rules (core/reasons.py PLACE, PUBLISH): the order is pure core
(core/boundary.py `place_rule`, `publish_rule`, no SGLang Req), asked lazily; the runtime counts
each decision (/server_info `radixflow.boundary_reasons`) and traces it (`cut` events)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from radixflow_sglang.core.boundary import place_rule, publish_rule
from radixflow_sglang.core.grid import Layout
from radixflow_sglang.core.reasons import Reason
from radixflow_sglang.testing.fixtures import model_grid


def asked(log: list, name: str, value):
    def f():
        log.append(name)
        return value
    return f


SOURCES = ("marker", "repeat", "queued", "learned")


@pytest.mark.parametrize("sources, want, calls", [
    ((5, 6, 8, 7), (Reason.MARKER, 5), ["marker"]),
    ((None, 6, 8, 7), (Reason.REPEAT, 6), ["marker", "repeat"]),
    ((None, None, 8, 7), (Reason.QUEUED_FORK, 8), ["marker", "repeat", "queued"]),
    ((None, None, None, 7), (Reason.LEARNED, 7), list(SOURCES)),
    ((None, None, None, None), (Reason.NO_BOUNDARY, None), list(SOURCES)),
])
def test_place_asks_the_undeclared_sources_in_order_and_stops_at_the_first(sources, want,
                                                                             calls):
    log: list = []
    srcs = [asked(log, n, v) for n, v in zip(SOURCES, sources, strict=True)]
    assert place_rule(None, True, False, *srcs) == want
    assert log == calls


def test_a_declaration_wins_and_nothing_is_learned_past_a_native_branch():
    log: list = []
    srcs = [asked(log, n, 9) for n in SOURCES]
    assert place_rule(lambda: 3, True, False, *srcs) == (Reason.DECLARED, 3)
    assert place_rule(lambda: None, True, False, *srcs) == (Reason.DECLARED, None)  # outside
    assert place_rule(None, True, True, *srcs) == (Reason.NATIVE_BRANCH, None)
    assert place_rule(None, False, False, *srcs) == (Reason.NO_BOUNDARY, None)
    assert log == []


def test_publish_order_per_layout():
    def no(*_):
        return False

    def yes(*_):
        return True

    def boom():
        raise AssertionError("asked out of order")

    eb, nb = Layout.EXTRA_BUFFER, Layout.NO_BUFFER
    assert publish_rule(None, nb, True, True, boom) is Reason.OUTSIDE
    assert publish_rule(64, eb, False, True, boom) is Reason.MOVE
    assert publish_rule(64, eb, True, True, boom) is Reason.MOVE
    assert publish_rule(64, nb, False, True, boom) is Reason.SLOT_TAKEN
    assert publish_rule(64, nb, True, True, no) is Reason.CUT_UNPAID
    assert publish_rule(64, nb, True, False, boom) is Reason.CUT  # declared: not asked
    assert publish_rule(64, nb, True, True, yes) is Reason.CUT


@pytest.mark.parametrize("layout, how", [("extra_buffer", "move"), ("no_buffer", "cut")])
def test_kit_declared_boundaries_are_counted_and_traced_by_rule(tmp_path, layout, how):
    """gsp-paced, 3 groups x 3, declared: each group's first publishes at the boundary (move or
    cut); its followers resume there, so the boundary is not inside their extend (outside)."""
    from radixflow_sglang.config import RadixFlowConfig
    from radixflow_sglang.testing.kit import Kit, KitConfig

    trace = tmp_path / "t.jsonl"
    cfg = RadixFlowConfig(policy="radixflow", boundaries="declared", trace=str(trace))
    k = Kit(KitConfig(model="qwen3.5-4b", layout=layout), policy="radixflow",
            radixflow_config=cfg)
    g, rng = model_grid("qwen3.5-4b"), random.Random(0)
    system = 3 * g + 10
    for grp in range(3):
        prompt = [rng.randrange(100, 200_000) for _ in range(system)]
        for i in range(3):
            k.submit(k.req(f"g{grp}r{i}", prompt + [rng.randrange(100, 200_000)
                                                   for _ in range(g + 3)], boundary=system))
            k.drain()
    counts = k.runtime.summary()["boundary_reasons"]
    assert counts == {"declared": 9, "outside": 6, how: 3}
    cuts = [json.loads(line) for line in trace.read_text().splitlines()]
    cuts = [e for e in cuts if e["event"] == "cut"]
    assert Counter(e["reason"] for e in cuts) == {"outside": 6, how: 3}
    assert all(e["placed"] == "declared" for e in cuts)
    assert k.runtime.boundary.moved["declared"] == 3
