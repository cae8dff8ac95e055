"""The twin's host-cost model charges the traversal per visited request (issue 12, sweep).

Its coefficients were fitted where the traversal visited every queued request; under load a
scan stops at the first full budget, so charging the whole queue made the traversal's scan
cost grow with the backlog (~0.1-0.5 s per scan at 20 q/s, 30x the kit's measured time) and
turned overload into a runaway queue for the traversal only.
"""

from __future__ import annotations

import pytest

from eval.hostcost import DEFAULT_HOST, HostCoef, HostCost
from radixflow_sglang.testing.kit import Round, ScanTiming

HOST = HostCost(HostCoef(1e-3, 1e-6, 1e-4), HostCoef(2e-3, 1e-3, 1e-4), source="test")


def _round(rows: int) -> Round:
    rids = [f"r{i}" for i in range(rows)]
    return Round(0, rids, dict.fromkeys(rids, 10), dict.fromkeys(rids, 0),
                 dict.fromkeys(rids), None)


@pytest.mark.parametrize("policy", ["traversal", "radixflow", "radixflow-always"])
def test_traversal_pays_per_visited_request(policy: str) -> None:
    h = HOST.host_fn(policy)(_round(4), ScanTiming(queued=100, cpu_s=0.0, visited=10))
    assert h == pytest.approx(HOST.traversal(10, 4))


@pytest.mark.parametrize("policy", ["stock", "radix", "flex"])
def test_the_native_scan_keeps_its_per_queued_term(policy: str) -> None:
    h = HOST.host_fn(policy)(_round(4), ScanTiming(queued=100, cpu_s=0.0, visited=10))
    assert h == pytest.approx(HOST.native(100, 4))


def test_a_scan_without_a_visit_count_falls_back_to_the_queue() -> None:
    h = HOST.host_fn("traversal")(_round(2), ScanTiming(queued=7, cpu_s=0.0))
    assert h == pytest.approx(HOST.traversal(7, 2))


def test_the_kit_reports_what_the_scan_visited(make_kit) -> None:
    """A backlog the budget cannot take: the traversal's scan stops early (visited < queued),
    and the kit's ScanTiming says how far it went, as the runtime counted it."""
    k = make_kit("qwen3.5-4b", "extra_buffer", "radixflow", tokens=2048)
    k.submit(*[k.req(f"q{i}", list(range(10_000 * i + 1, 10_000 * i + 1001))) for i in range(20)])
    k.step()
    scan = k.last_scan
    assert scan.queued == 20
    assert scan.visited == k.runtime.stats.visited
    assert 0 < scan.visited < scan.queued
    assert DEFAULT_HOST.host_fn("radixflow")(k.rounds[-1], scan) == pytest.approx(
        DEFAULT_HOST.traversal(scan.visited, len(k.rounds[-1].rids)))
    stock = make_kit("qwen3.5-4b", "extra_buffer", "stock", tokens=2048)
    stock.submit(stock.req("a", list(range(1, 100))))
    stock.step()
    assert stock.last_scan.visited is None  # SGLang's own scan: no runtime counts it
