"""eval/sweep.py: the capacity sweep (issue 12 item 3).

The definitions (pace, backlog growth, max sustainable rate, refinement) are checked on
constructed arrival/completion times; one quick sweep runs end to end through the twin (SGLang's
real scheduler on CPU) and its sweep.json is checked against its own points.
"""

from __future__ import annotations

import json
import math

import pytest

from eval import sweep, waste

# --- definitions -----------------------------------------------------------------------------


def test_pace_of_a_stable_queue_is_one_and_its_backlog_flat() -> None:
    arrivals = [i / 10 for i in range(200)]  # 10/s
    ratio, growth = sweep.pace(arrivals, [a + 0.3 for a in arrivals])  # constant latency
    assert ratio == pytest.approx(1.0)
    assert abs(growth) < 0.005  # discretization only


@pytest.mark.parametrize("mu_over_lambda", [0.5, 0.8])
def test_pace_under_overload_estimates_the_service_share(mu_over_lambda: float) -> None:
    lam = 10.0
    mu = mu_over_lambda * lam
    arrivals = [i / lam for i in range(400)]
    done, t = [], 0.0
    for a in arrivals:  # one server, FIFO, service time 1 / mu
        t = max(t, a) + 1 / mu
        done.append(t)
    ratio, growth = sweep.pace(arrivals, done)
    assert ratio == pytest.approx(mu_over_lambda, abs=0.01)
    assert growth == pytest.approx(1 - mu_over_lambda, abs=0.02)


def test_pace_of_a_burst_has_nothing_to_keep_pace_with() -> None:
    assert sweep.pace([0.0] * 4, [1.0, 2.0, 3.0, 4.0]) == (1.0, 0.0)


def _pt(rate: float, ok: bool) -> dict:
    return {"rate": rate, "sustainable": ok}


def test_max_rate_stops_at_the_first_unsustainable_rate() -> None:
    pts = [_pt(8, False), _pt(1, True), _pt(2, True), _pt(4, False), _pt(16, True)]
    assert sweep.max_rate(pts) == (2, 4)  # 16 passes above a failure: does not count
    assert sweep.max_rate([_pt(1, True), _pt(2, True)]) == (2, None)
    assert sweep.max_rate([_pt(1, False), _pt(2, True)]) == (None, 1)


def test_judge_names_every_failed_criterion() -> None:
    pt = {"throughput_ratio": 0.9, "backlog_growth": 0.2, "latency_p95_s": 3.0}
    sweep.judge(pt, slo=2.0)
    assert not pt["sustainable"] and len(pt["why"]) == 3
    pt = {"throughput_ratio": 0.97, "backlog_growth": 0.01, "latency_p95_s": 1.0}
    assert sweep.judge(pt, slo=2.0)["sustainable"] and pt["why"] == []


def test_refinement_bisects_between_the_last_pass_and_the_first_failure(monkeypatch) -> None:
    """The sweep's bookkeeping with a stand-in for the replay (capacity 10 q/s for stock, 25
    for the other): the ladder, two bisections, the ratio."""
    cap = {"stock": 10.0, "radixflow": 25.0}
    ran: list[tuple[str, float]] = []

    def fake(setup, tasks, workers):
        ran.extend(tasks)
        return [{"rate": r, "failed": False, "throughput_ratio": min(1.0, cap[p] / r),
                 "backlog_growth": 0.0, "latency_p95_s": 0.1, "scheduled_tokens": 100}
                for p, r in tasks]

    monkeypatch.setattr(sweep, "run_points", fake)
    doc = sweep.sweep(sweep.Setup(), ["stock", "radixflow"], [4, 1, 16, 64], slo=1.0, refine=2)
    stock, rf = doc["policies"]["stock"], doc["policies"]["radixflow"]
    assert [p["rate"] for p in stock["points"]] == sorted(p["rate"] for p in stock["points"])
    assert stock["max_rate"] == 8.0  # 4 -> sqrt(4 * 16) = 8 passes -> sqrt(8 * 16) fails
    # 16 passes, 64 fails -> sqrt(16 * 64) = 32 fails -> sqrt(16 * 32) = 22.63 passes
    assert rf["max_rate"] == pytest.approx(22.63) and rf["first_unsustainable"] == 32.0
    assert doc["ratio_vs_stock"]["radixflow"] == pytest.approx(22.63 / 8)
    assert sum(1 for p, _ in ran if p == "stock") == 4 + 2
    assert all(p.get("refine") for p in stock["points"] if p["rate"] not in (1, 4, 16, 64))


def test_the_default_ladder_is_geometric_and_increasing() -> None:
    r = sweep.DEFAULT_RATES
    steps = {round(b / a, 9) for a, b in zip(r, r[1:], strict=False)}
    assert len(steps) == 1 and steps.pop() > 1


# --- end to end ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep")
    rc = sweep.main(["--quick", "--out", str(out)])
    return rc, out, json.loads((out / "sweep.json").read_text())


def test_quick_sweep_writes_the_schema(quick) -> None:
    rc, out, doc = quick
    assert rc == 0
    assert (out / "report.md").read_text().startswith("# Capacity sweep")
    assert (out / "sweep.png").stat().st_size > 0
    assert set(doc["policies"]) == {"stock", "radixflow"}
    assert set(doc["ratio_vs_stock"]) == {"radixflow"}
    rates = list(sweep.QUICK["rates"])
    for d in doc["policies"].values():
        assert [p["rate"] for p in d["points"]] == rates  # the ladder, in order, no refinement
        for p in d["points"]:
            for key in ("latency_mean_s", "latency_p95_s", "scheduled_tokens",
                        "throughput_ratio", "backlog_growth", "offered_rate", "sustainable"):
                assert key in p
    u = doc["unloaded"]
    assert u["rate"] == rates[0] / 4
    assert doc["slo_p95_s"] == pytest.approx(sweep.SLO_FACTOR * u["latency_p95_s"])


def test_quick_sweep_max_rate_follows_its_points(quick) -> None:
    _, _, doc = quick
    for d in doc["policies"].values():
        flags = [p["sustainable"] for p in d["points"]]
        k = flags.index(False) if False in flags else len(flags)
        assert d["max_rate"] == (d["points"][k - 1]["rate"] if k else None)
        for p in d["points"]:
            assert p["sustainable"] == (p["throughput_ratio"] >= sweep.PACE
                                        and p["backlog_growth"] <= sweep.GROWTH
                                        and p["latency_p95_s"] <= doc["slo_p95_s"])
    stock = doc["policies"]["stock"]["max_rate"]
    rf = doc["policies"]["radixflow"]["max_rate"]
    want = rf / stock if stock and rf is not None else None
    assert doc["ratio_vs_stock"]["radixflow"] == want


def test_quick_sweep_scales_one_arrival_pattern(quick) -> None:
    """Every rate replays the same seed's gaps scaled by 1 / rate, so the realized rate is the
    nominal one times one constant, and the stock points' tokens ratio is exactly 1."""
    _, _, doc = quick
    pts = doc["policies"]["stock"]["points"]
    k = [p["offered_rate"] / p["rate"] for p in pts]
    assert all(math.isfinite(x) for x in k) and max(k) / min(k) - 1 < 1e-9
    assert all(p["tokens_vs_stock"] == 1.0 for p in pts)
    assert all(0 < p["tokens_vs_stock"] < 1 for p in doc["policies"]["radixflow"]["points"])


def test_quick_sweep_measures_tokens_against_the_oracle(quick) -> None:
    """The oracle (each shared prefix computed once) bounds every policy from below at every
    rate, so tokens vs oracle >= 1 and tokens vs stock >= oracle vs stock; stock recomputes."""
    _, _, doc = quick
    for d in doc["policies"].values():
        for p in d["points"]:
            assert p["unique_tokens"] > 0
            assert waste.check(p["waste"]) and p["waste"]["scheduled"] == p["scheduled_tokens"]
            assert p["tokens_vs_oracle"] == pytest.approx(p["scheduled_tokens"]
                                                          / p["unique_tokens"])
            assert p["tokens_vs_oracle"] >= 1.0
            assert p["tokens_vs_stock"] >= p["oracle_vs_stock"]
        assert d["tokens_vs_oracle_max"] == max(p["tokens_vs_oracle"] for p in d["points"])
    assert all(p["tokens_vs_oracle"] > 1.0 for p in doc["policies"]["stock"]["points"])


def _top(rate: float, pace: float, **kw) -> dict:
    return {"rate": rate, "throughput_ratio": pace, "completion_rate": kw.pop("mu", rate),
            "scheduled_tokens": kw.pop("tokens", 1000), "waste": kw.pop("waste", {}), **kw}


def test_saturation_reads_the_top_rate_and_scales_it_to_the_floor() -> None:
    """Service at the top swept rate when it overloads the policy, and that service scheduling
    only the oracle plus the grid's recompute at the policy's own time per token."""
    pts = [_top(64, 0.4, mu=10.0, tokens=2000, waste={"unique": 900, "grid": 100}),
           _top(8, 1.0), {"rate": 128, "failed": True}]
    s = sweep.saturated(pts)
    assert s == {"rate": 64, "service_rate": 10.0, "floor_tokens": 1000,
                 "tokens_vs_floor": 2.0, "at_floor": 20.0}
    assert sweep.saturated([_top(8, 1.0), _top(64, sweep.PACE)]) is None  # keeps pace
    assert sweep.saturated([{"rate": 1, "failed": True}]) is None


def test_quick_sweep_reports_saturation_against_stocks_service(quick) -> None:
    _, out, doc = quick
    pol = doc["policies"]
    stock = pol["stock"]["saturated"]
    assert stock is not None and stock["vs_stock"] == 1.0  # 16 questions at 64 q/s overload it
    for d in pol.values():
        top = max(d["points"], key=lambda p: p["rate"])
        s = d["saturated"]
        if top["throughput_ratio"] >= sweep.PACE:
            assert s is None
            continue
        floor = top["waste"]["unique"] + top["waste"]["grid"]
        assert s["floor_tokens"] == floor and s["service_rate"] == top["completion_rate"]
        assert s["tokens_vs_floor"] >= 1.0
        assert s["at_floor_vs_stock"] == pytest.approx(
            top["completion_rate"] * top["scheduled_tokens"] / floor / stock["service_rate"])
    assert "## At saturation" in (out / "report.md").read_text()


# --- bad flags -------------------------------------------------------------------------------


@pytest.mark.parametrize("argv, flag", [
    (["--rates", "4"], "--rates"),
    (["--rates", "1,x"], "--rates"),
    (["--rates", "1,-2"], "--rates"),
    (["--policies", "stock,nope"], "--policies"),
    (["--questions", "2"], "--questions"),
    (["--questions", "0"], "--questions"),
    (["--slo-p95-s", "-1"], "--slo-p95-s"),
    (["--refine", "-1"], "--refine"),
    (["--model", "gpt-9"], "--model"),
    (["--workload", "no-such-workload"], "--workload"),
])
def test_bad_flags_name_the_flag(tmp_path, capsys, argv, flag) -> None:
    with pytest.raises(SystemExit) as e:
        sweep.main(["--quick", "--out", str(tmp_path), *argv])
    assert e.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err
    assert not (tmp_path / "sweep.json").exists()
