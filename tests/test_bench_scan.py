"""eval/bench_scan.py's steady mode: a serving kit's scans, and the hook timer (issue 50)."""

from __future__ import annotations

import pytest

from eval import bench_scan
from radixflow_sglang.adapter.runtime import RadixFlowRuntime

MODEL = "qwen3.5-0.8b"


def test_steady_times_every_visiting_scan_after_the_warmup():
    scans = bench_scan.steady("stock", 2, shared=False, model=MODEL, waves=5, seed=0)
    # NOTE: 5 waves, the first (5 // 5) warms the kit: each of the 4 timed waves' two
    # independent 2,040-token requests fits one round of the 0.8B budget
    assert len(scans) == 4
    assert all(s.visited == 2 and s.rows == 2 and s.cpu_s > 0 for s in scans)


def test_steady_waves_bring_their_own_documents():
    first, second = _queue(shared=True, wave=1), _queue(shared=True, wave=2)
    a = [tuple(r.origin_input_ids[:8]) for r in first]
    b = [tuple(r.origin_input_ids[:8]) for r in second]
    assert a[0] == a[2] and a[0] != a[3]  # NOTE: three branches per document
    assert not set(a) & set(b)
    assert [r.rid for r in first][:2] == ["w1.r0", "w1.r1"]


def _queue(shared: bool, wave: int):
    from radixflow_sglang.testing.kit import Kit, KitConfig

    kit = Kit(KitConfig(model=MODEL), policy="stock")
    return bench_scan.queue(kit, 6, shared, seed=0, wave=wave)


def test_hook_timer_times_only_radixflow_arms_and_restores_the_class():
    before = {name: RadixFlowRuntime.__dict__[name] for name in bench_scan.HOOKS}
    timer = bench_scan.HookTimer()
    with timer.installed():
        assert all(RadixFlowRuntime.__dict__[n] is not f for n, f in before.items())
        runs = {p: bench_scan.steady(p, 3, shared=True, model=MODEL, waves=5, seed=1,
                                     hooks=timer, layout="no_buffer")
                for p in ("stock", "radixflow")}
    assert all(RadixFlowRuntime.__dict__[n] is f for n, f in before.items())
    assert set(timer.seconds) == {"radixflow"}  # NOTE: stock runs SGLang's class: no hooks
    seconds = timer.seconds["radixflow"]
    assert {"hold", "begin_scan", "park", "after_add", "end_scan"} <= set(seconds)
    assert all(v > 0 for v in seconds.values())
    (line,) = timer.lines(runs)
    assert line.startswith("  radixflow hooks, us per scan: ")
    assert timer.arm is None


@pytest.mark.parametrize("argv, flag", [
    (["--steady", "4"], "--steady"),
    (["--layout", "no_buffer"], "--layout: needs --steady"),
    (["--hooks"], "--hooks: needs --steady"),
    (["--steady", "5", "--profile", "radixflow"], "--profile"),
])
def test_bad_arguments_name_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        bench_scan.main(argv)
    assert e.value.code == 2
    assert flag in capsys.readouterr().err
