"""Issue 13 item 7: with --disable-radix-cache (0.5.23 builds UnifiedRadixCache with
disable=True) nothing a producer publishes can be reused, so traversal never parks, no_buffer
never cuts a producer and the fragmentation guard never defers: RadixFlow's rounds are
radix's, round by round (admission at 0 ms, so holding changes nothing either)."""

from __future__ import annotations

import pytest

from radixflow_sglang.adapter.runtime import RadixFlowConfig

DOC = list(range(1000, 3000))


def _workload(k):
    # four siblings over one long document, a request cut into a short fragment, fillers
    reqs = [k.req(f"s{i}", DOC + [i, 7, 7]) for i in range(4)]
    reqs += [k.req("big", list(range(10_000, 16_000))), k.req("frag", list(range(20_000, 20_300)))]
    reqs += [k.req(f"f{i}", list(range(30_000 + 500 * i, 30_200 + 500 * i))) for i in range(3)]
    return reqs


def _rounds(make_kit, policy, layout, overlap, disable):
    cfg = None if policy == "radix" else RadixFlowConfig(policy=policy, admission_ms=0.0)
    k = make_kit(layout=layout, policy=policy, radixflow_config=cfg, overlap=overlap,
                 disable_radix_cache=disable, tokens=6200)
    k.submit(*_workload(k))
    rounds = k.drain()
    rt = k.runtime
    assert k.leaks() == {"kv": 0, "rows": 0, "mamba": 0}
    return [(r.rids, r.extend, r.prefix, r.chunked) for r in rounds], rt


@pytest.mark.parametrize("layout, overlap", [("extra_buffer", True), ("no_buffer", False)])
@pytest.mark.parametrize("policy", ["traversal", "radixflow-frag"])
def test_radixflow_is_radix_round_by_round_without_a_radix_cache(make_kit, policy, layout,
                                                                 overlap):
    radix, _ = _rounds(make_kit, "radix", layout, overlap, disable=True)
    ours, rt = _rounds(make_kit, policy, layout, overlap, disable=True)
    assert ours == radix
    t = rt.totals
    assert (t.blocked, t.forks, t.frag_deferred) == (0, 0, 0)
    assert rt.traversal is None and not rt.spec.frag


def test_with_the_cache_on_the_same_workload_parks(make_kit):
    """Control: the workload above does exercise traversal when the cache is on."""
    _, rt = _rounds(make_kit, "traversal", "extra_buffer", True, disable=False)
    assert rt.totals.blocked > 0
