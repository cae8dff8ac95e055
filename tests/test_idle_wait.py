"""A wait that launches nothing (docs/design.md, "Overlap: a wait that launches nothing").

Under overlap a request can arrive while the producer of its prefix is still in flight. If this
round would run nothing but its group (nothing selected, nothing decoding next, nothing queued
after it), waiting launches no round: the loop processes the producer's result and scans again,
and the group runs with the producer's state, a host pass later than a recompute would have
started. The wait rule priced that wait as a whole round, so a QuALITY question's late siblings
recomputed their 2,900-token document behind their producer (live, paper profile).

- core: the verdict turns on `idle_wait_s` (and on its size), not on anything else;
- on SGLang's real scheduler (kit, overlap): the siblings park on the producer in flight and
  run with its state; with the producer decoding on (a round runs anyway) they recompute, as
  before; without overlap nothing is ever in flight (covered by scripts/decisions.sh).
"""

from __future__ import annotations

import pytest

from radixflow_sglang.core.cost import CostCoeffs, RoundView, WaitCase, group_wait_wins

PAPER_08B = CostCoeffs(42.6e-3, 7.1e-6, 1e-4, 0.0)  # profiles.py: qwen3.5-0.8b at the paper's cost
DOC = list(range(10_000, 12_048))  # 2,048 shared tokens


def _view(**kw) -> RoundView:
    base = dict(rows=0, behind=2, budget_left=8192, demand_after=2100, mean_extend=2100,
                rows_left=60, siblings=1)
    return RoundView(**(base | kw))


def test_a_wait_that_launches_nothing_costs_a_host_pass_not_a_round() -> None:
    case = WaitCase(ready=0, depth=2048, length=2100, lag=1)
    assert not group_wait_wins(PAPER_08B, case, _view()).wait  # a round: 42.6 ms each
    idle = group_wait_wins(PAPER_08B, case, _view(idle_wait_s=0.004))
    assert idle.wait
    assert idle.wait_s == pytest.approx(2 * 0.004 + 3 * 52 * 7.1e-6 + 3 * 1e-4, rel=0.05)
    # NOTE: a pass longer than the recompute it saves (2 x 2,048 tokens x 2 rows) loses again
    assert not group_wait_wins(PAPER_08B, case, _view(idle_wait_s=0.06)).wait


# --- on SGLang's real scheduler (overlap) -----------------------------------------------------


def _kit(make_kit, resume_s: float | None = 0.004, trace=None):
    """`resume_s`: the loop's measured pass from a result to the next launch (a server's
    LaunchPeriods; the kit feeds none); `trace`: a trace file for the decisions."""
    from radixflow_sglang.config import RadixFlowConfig

    cfg = RadixFlowConfig(policy="radixflow", trace=str(trace)) if trace is not None else None
    k = make_kit("qwen3.5-0.8b", "extra_buffer", "radixflow", overlap=True,
                 radixflow_config=cfg)
    k.runtime.use_prior(PAPER_08B)
    if resume_s is not None:
        k.runtime.roundcost.fit.observe_resume(0.05 + resume_s, 0.05)
    return k


def _late_siblings(k, producer_tokens: int):
    """P alone, launched; its siblings B and C arrive while its forward runs."""
    k.submit(k.req("P", DOC + [7] * 40, max_new_tokens=producer_tokens))
    first = k.step()
    assert first is not None and first.rids == ["P"] and len(k.sched.result_queue) == 1
    k.submit(k.req("B", DOC + [8] * 52), k.req("C", DOC + [9] * 52))


def test_late_siblings_wait_for_a_producer_in_flight_when_nothing_else_runs(make_kit) -> None:
    k = _kit(make_kit)
    _late_siblings(k, producer_tokens=1)
    assert k.step() is None  # parked: no round launched; P's result processed
    assert sorted(k.runtime.records.parked()) == ["B", "C"]
    assert k.runtime.summary()["reasons"].get("wait_wins", 0) >= 1
    rnd = k.step()
    assert sorted(rnd.rids) == ["B", "C"]
    assert min(rnd.prefix.values()) >= 1024  # P's state at its fork, not a recompute
    k.drain()
    assert sorted(k.finished) == ["B", "C", "P"]


@pytest.mark.parametrize("resume_s", [0.08, None])
def test_late_siblings_recompute_when_the_pass_costs_more_or_is_unknown(make_kit,
                                                                      resume_s) -> None:
    """A pass longer than the recompute it saves (a loaded host's), or none measured yet and
    no scan time fed (a simulated server's first rounds): priced as a round, as before."""
    k = _kit(make_kit, resume_s)
    _late_siblings(k, producer_tokens=1)
    rnd = k.step()
    assert rnd is not None and sorted(rnd.rids) == ["B", "C"]
    assert max(rnd.prefix.values()) == 0


def test_with_the_producer_decoding_on_a_wait_is_priced_as_a_round(make_kit, tmp_path) -> None:
    """P decodes on: its decode round runs whatever B and C do, so their wait costs a round
    (no idle pass), and P is among the requests their recompute would delay: its decode waits
    for their prefill (adapter/reqs.py `decoding`: P is in the scan's running batch, not yet
    in `sched.running_batch`). The wait wins here on that count."""
    import json

    trace = tmp_path / "t.jsonl"
    k = _kit(make_kit, trace=trace)
    _late_siblings(k, producer_tokens=8)
    rnd = k.step()
    assert rnd is not None and rnd.mode == "decode" and rnd.rids == ["P"]
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    decided = [e for e in events if e["event"] == "decide"]
    assert decided and all(e["view"]["idle_wait_s"] is None for e in decided)
    assert decided[0]["view"]["behind"] == 3  # B, C and P's decode
    assert sorted(k.runtime.records.parked()) == ["B", "C"]
    k.drain()
    assert sorted(k.finished) == ["B", "C", "P"]


def test_the_view_is_idle_only_for_the_queue_tail(make_kit) -> None:
    """A queued request after the group runs this round anyway: no idle wait."""
    k = _kit(make_kit)
    _late_siblings(k, producer_tokens=1)
    k.submit(k.req("U", list(range(50_000, 50_300))))
    rnd = k.step()
    assert rnd is not None and sorted(rnd.rids) == ["B", "C", "U"]
    assert max(rnd.prefix.values()) == 0
