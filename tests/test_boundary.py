"""Publication boundaries (issue 15) on SGLang's real cache, pools, Req and scan (the kit).

Shape (gsp-paced, small): groups of siblings share a system prompt of 3 grid units + a bit and
differ in a question longer than a grid unit, so a producer's native state lands inside its own
question; every request arrives after the previous one finished. Depths derive from the grid.
"""

from __future__ import annotations

import itertools
import random
import shutil
from pathlib import Path

import pytest

from radixflow_sglang.core.boundary import (
    CONTINUATION,
    FORK,
    BoundaryLearner,
    MarkerLearner,
    _kgram_index,
    common_runs,
    longest_common_run,
    optimal_placement,
    place,
    publish_at,
    shared_run_end,
    wants,
)
from radixflow_sglang.core.grid import Grid, Layout
from radixflow_sglang.testing.fixtures import boundary_kit, doc_questions, model_grid

LAYOUTS = ("extra_buffer", "no_buffer")
MODEL = "qwen3.5-4b"


def grid_of(model: str = MODEL) -> int:
    return model_grid(model)


def make(policy: str = "radixflow", boundaries: str = "declared", layout: str = "extra_buffer",
         **publisher):
    return boundary_kit(policy, boundaries, layout, MODEL, **publisher)


def run_one(kit, rid: str, ids, **req) -> tuple[int, int]:
    """Submit one request, drain: (its ready prefix when first scheduled, tokens scheduled)."""
    kit.submit(kit.req(rid, ids, **req))
    rounds = kit.drain()
    cached = next(r.prefix[rid] for r in rounds if rid in r.prefix)
    return cached, sum(r.extend.get(rid, 0) for r in rounds)


def gsp_paced(kit, groups: int, per_group: int, system: int, question: int, declare: bool,
              seed: int = 0) -> list[tuple[int, int, int, int]]:
    """(group, index, cached, scheduled) per request; siblings arrive one after another."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(100, 200_000) for _ in range(system)]
        for i in range(per_group):
            ids = prompt + [rng.randrange(100, 200_000) for _ in range(question)]
            cached, sched = run_one(kit, f"g{g}r{i}", ids,
                                    boundary=system if declare else None)
            out.append((g, i, cached, sched))
    return out


def followers_without_hit(res) -> int:
    return sum(1 for _, i, cached, _ in res if i > 0 and cached == 0)


# --- the engine-free core -------------------------------------------------------------------


def test_publish_at_floors_to_the_grid_inside_the_extend():
    eb, nb = Grid(Layout.EXTRA_BUFFER, 64), Grid(Layout.NO_BUFFER, 64)
    assert publish_at(eb, 200, 0, 300) == 192
    assert publish_at(eb, 200, 128, 172) == 192  # relative to the ready prefix, on the grid
    assert publish_at(eb, 200, 192, 108) is None  # already ready at the boundary's floor
    assert publish_at(eb, 320, 0, 300) is None  # past the extend: its end publishes natively
    assert publish_at(eb, 200, 100, 200) == 164  # an off-grid prefix (a chunk's): G from it
    assert publish_at(nb, 200, 0, 300) == 200  # no_buffer: a chunk end, on the page
    assert publish_at(Grid(Layout.FULL, 1), 200, 0, 300) is None  # every page is published
    assert wants("both", "learned") and wants("declared", "declared")
    assert not wants("off", "declared") and not wants("learned", "declared")
    with pytest.raises(ValueError, match="choose from off, declared, learned, both"):
        wants("sometimes", "declared")


def _brute(depths, weights, m, base=0):
    pts = sorted({d for d in depths if d > base})
    best = 0.0
    for k in range(1, m + 1):
        for chosen in itertools.combinations(pts, k):
            v = sum(w * max([c - base for c in chosen if c <= x], default=0)
                    for x, w in zip(depths, weights, strict=True))
            best = max(best, v)
    return best


def test_optimal_placement_matches_brute_force():
    rng = random.Random(5)
    for _ in range(40):
        n = rng.randrange(1, 7)
        depths = [rng.randrange(0, 12) * 64 for _ in range(n)]
        weights = [rng.random() for _ in range(n)]
        for m in (1, 2, 3):
            chosen, value = optimal_placement(depths, weights, m)
            assert value == pytest.approx(_brute(depths, weights, m))
            got = sum(w * max([c for c in chosen if c <= x], default=0)
                      for x, w in zip(depths, weights, strict=True))
            assert got == pytest.approx(value) and len(chosen) <= m


def _tails_before(pts, depths, weights):
    """`_tails` as it was before 9d4149b: each candidate's mass summed by a scan of all."""
    from collections import Counter

    mass = Counter()
    for d, w in zip(depths, weights, strict=True):
        mass[d] += w
    tail = [0.0] * (len(pts) + 1)
    for i in range(len(pts) - 1, -1, -1):
        tail[i] = tail[i + 1] + sum(w for d, w in mass.items() if pts[i] <= d
                                    and (i + 1 == len(pts) or d < pts[i + 1]))
    return tail


def test_optimal_placement_picks_what_it_picked_before_bit_for_bit():
    """A refactor (the one-state path PLACE takes per selected request): the same tail masses
    as the scan they replace, and the one-state path the same depth and float value as the
    table, ties (integer weights) included, any base."""
    from radixflow_sglang.core.boundary import _table, _tails

    rng = random.Random(11)
    for _ in range(3000):
        n = rng.randrange(1, 9)
        depths = [rng.randrange(0, 40) * 16 for _ in range(n)]
        weights = ([float(rng.randrange(0, 4)) for _ in range(n)] if rng.random() < 0.5
                   else [rng.random() * rng.choice((1, 1e-3, 64)) for _ in range(n)])
        base = rng.choice((0, 0, 64, 200))
        pts = sorted({d for d in depths if d > base})
        if not pts:
            continue
        tail = _tails(pts, depths, weights)
        assert tail == _tails_before(pts, depths, weights)
        assert optimal_placement(depths, weights, 1, base) == _table(pts, tail, 1, base)


def test_learner_moves_to_a_fork_depth_only_when_it_serves_more():
    lr = BoundaryLearner(64, support=2)
    assert lr.predict("ns", 0, 2112) is None  # nothing seen
    lr.observe("ns", 0, None, 2048)  # a sibling left a cached path at 2048 (SGLang's branch)
    assert lr.predict("ns", 0, 2112) is None  # seen once: below the support
    lr.published(("k",), "branch")
    assert lr.observe("ns", 2048, ("k",), None) == FORK  # a hit on a branch state: a fork
    assert lr.predict("ns", 0, 2112) == 2048
    assert lr.predict("other", 0, 2112) is None  # namespaces never mix
    assert lr.predict("ns", 2048, 2112) is None  # already ready there
    # continuations (hits on end states) weigh for the state the move would displace
    for i in range(40):
        lr.published(("end", i), "end")
        assert lr.observe("ns", 2112, ("end", i), None) == CONTINUATION
    assert lr.predict("ns", 0, 4096) is None  # (2048 * 2) < (4096 - 2048) * 40
    mode = BoundaryLearner(64, support=2, rule="mode")
    mode._events = lr._events
    assert mode.predict("ns", 0, 4096) == 2048  # the simple rule ignores what it displaces
    with pytest.raises(ValueError, match="choose from optimal, mode"):
        BoundaryLearner(64, rule="best")



def test_the_default_learner_moves_from_the_first_fork_but_not_over_continuations():
    """One fork is enough (docs/notes/2026-12-first-fork.md): under shuffled arrivals most
    groups' first members run before a second fork is seen. Continuations still weigh."""
    lr = BoundaryLearner(64)
    lr.observe("ns", 0, None, 2048)
    assert lr.predict("ns", 0, 2112) == 2048 and lr.predict("other", 0, 2112) is None
    for i in range(2):
        lr.published(("end", i), "end")
        lr.observe("ns", 2112, ("end", i), None)
    assert lr.predict("ns", 0, 2112) == 2048  # 2048 * 1 > 64 * 2: the tail is cheap
    assert lr.predict("ns", 0, 6144) is None  # 2048 * 1 < 4096 * 2: the end serves more
    lr.observe("ns", 1023, ("r", 0), None, repeat=True)
    assert not lr.repeat_wins("ns", 0, 1024, 1023)  # NOTE: a retry is one repeat: below two

# --- declared: the request field (kit) ----------------------------------------------------------


def test_stock_second_sibling_gets_nothing():
    """SGLang's own behaviour on the shape: the second sibling recomputes the system prompt
    (the first published inside its question), SGLang's branching serves the third."""
    G = grid_of()
    res = gsp_paced(make("stock"), 4, 4, 3 * G + 10, G + 3, declare=True)
    by = {(g, i): cached for g, i, cached, _ in res}
    for g in range(4):
        assert by[g, 1] == 0 and by[g, 2] == by[g, 3] == 3 * G
    assert followers_without_hit(res) == 4


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy", ["radix", "radixflow"])
def test_declared_boundary_every_sibling_hits(layout, policy):
    G = grid_of()
    system = 3 * G + 10
    kit = make(policy, "declared", layout)
    res = gsp_paced(kit, 4, 4, system, G + 3, declare=True)
    floor = system // G * G if layout == "extra_buffer" else system
    assert [c for _, i, c, _ in res if i > 0] == [floor] * 12
    assert kit.runtime.boundary.moved["declared"] == 4  # the first of each group only
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}
    off = gsp_paced(make(policy, "off", layout), 4, 4, system, G + 3, declare=True)
    assert followers_without_hit(off) >= 4  # the field is ignored with boundaries off


def test_declared_boundary_state_is_the_tracked_one():
    """extra_buffer: the producer's one tracked state (mamba_last_track_seqlen) sits at the
    boundary's grid floor instead of its own end."""
    G = grid_of()
    kit = make("radix", "declared")
    ids = list(range(1000, 1000 + 4 * G + 13))
    kit.submit(kit.req("p", ids, boundary=3 * G + 10))
    rounds = kit.drain()
    assert rounds[0].track["p"] == 3 * G
    stock = make("stock")
    stock.submit(stock.req("p", ids))
    assert stock.drain()[0].track["p"] == 4 * G


# --- declared: the frontend fork's prefix (max_new_tokens=0) -------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fork_prefix_request_is_its_own_boundary(layout):
    from radixflow_sglang.adapter.boundary import declared_boundary

    G = grid_of()
    prefix = list(range(5000, 5000 + 3 * G + 10))
    kit = make("radixflow", "declared", layout)
    pre = kit.req("prefix", prefix, max_new_tokens=0)
    assert declared_boundary(pre) == len(prefix) - 1  # NOTE: identical copies match len - 1
    kit.submit(pre)
    kit.drain()
    want = len(prefix) // G * G if layout == "extra_buffer" else len(prefix)
    for k in range(4):
        cached, _ = run_one(kit, f"b{k}", prefix + [70 + k] * (G + 3))
        assert cached == want
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


def test_n_sampling_warm_request_serves_its_identical_copies():
    """SGLang's `n > 1` path: a max_new_tokens=0 request, then n copies of the same prompt
    (#22935). A grid-aligned prompt's native state lies at its full length, which a copy cannot
    match (SGLang computes at least one token): stock's copies get nothing; the warm request
    publishes at the grid floor of len - 1 instead, and every copy hits there."""
    G = grid_of()
    prompt = list(range(6000, 6000 + 4 * G))
    got = {}
    for policy in ("stock", "radixflow"):
        kit = make(policy, "declared", "extra_buffer")
        kit.submit(kit.req("warm", prompt, max_new_tokens=0))
        kit.drain()
        got[policy] = [run_one(kit, f"c{k}", prompt)[0] for k in range(3)]
        assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}
    assert got["stock"][0] == 0
    assert got["radixflow"] == [3 * G] * 3


# --- declared: the system message of a chat template ---------------------------------------------


@pytest.fixture(scope="module")
def chat_tokenizer(tmp_path_factory):
    pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("jinja2")
    from radixflow_sglang import tokenizer as bt

    out = tmp_path_factory.mktemp("tok")
    src = Path(bt.__file__).parent / "model_dirs" / "qwen3.5-0.8b" / "config.json"
    shutil.copy(src, out / "config.json")
    bt.ensure_tokenizer(out)
    return transformers.AutoTokenizer.from_pretrained(str(out))


def test_system_message_end_is_the_boundary(chat_tokenizer):
    from radixflow_sglang.adapter.chat import system_boundary, token_ids

    tok = chat_tokenizer
    system = {"role": "system", "content": "You are a careful assistant. " * 20}
    msgs = [system, {"role": "user", "content": "What is 2 + 2?"}]
    ids = tok.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    ids = token_ids(ids)
    b = system_boundary(tok, msgs, ids)
    alone = tok.apply_chat_template([system], tokenize=True, add_generation_prompt=False)
    alone = token_ids(alone)
    assert b == len(alone) and ids[:b] == alone  # the system block, rendered, ends here
    assert tok.decode(ids[b:]).startswith("<|im_start|>user")
    other = [system, {"role": "user", "content": "Name a prime."}]
    ids2 = tok.apply_chat_template(other, tokenize=True, add_generation_prompt=True)
    ids2 = token_ids(ids2)
    assert system_boundary(tok, other, ids2) == b  # siblings share exactly this prefix
    assert system_boundary(tok, msgs[1:], ids) is None  # no system message: no boundary


# --- learned ---------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_learned_boundary_after_the_first_group(layout):
    G = grid_of()
    system = 3 * G + 10
    kit = make("radixflow", "learned", layout)
    res = gsp_paced(kit, 4, 4, system, G + 3, declare=False)
    # NOTE: only the first group pays (its second sibling); from the second group on every
    # sibling hits. (no_buffer missed its third too before the first fork's text was learned:
    # now it is cut right after that text, the system prompt's exact end.)
    assert followers_without_hit(res) == 1
    # NOTE: learned depths are grid floors of observed fork depths, in either layout
    assert [c for g, i, c, _ in res if g > 0 and i > 0] == [3 * G] * 9
    assert kit.runtime.boundary.moved["learned"] >= 3
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("policy", ["traversal-always", "radixflow"])
def test_a_learned_depth_does_not_take_the_state_queued_siblings_share_deeper(layout, policy):
    """Seen on the embedded server: depths learned from short system prompts (3 G) were applied
    to the first of three queued branches of a long document, whose one state then went to
    3 G; the siblings found only that and recomputed the document. The fork they share is known
    demand: the learned guess must yield to it."""
    G = grid_of()
    kit = make(policy, "learned", layout)
    gsp_paced(kit, 2, 3, 3 * G + 10, G + 3, declare=False)
    assert kit.runtime.boundary.moved["learned"] >= 1  # it did learn 3 G
    rng = random.Random(7)
    doc = [rng.randrange(100, 200_000) for _ in range(12 * G + 5)]
    rids = [f"s{i}" for i in range(3)]
    kit.submit(*[kit.req(r, doc + [rng.randrange(100, 200_000) for _ in range(40)])
                 for r in rids])
    rounds = kit.drain()
    first = {r: next(x.prefix[r] for x in rounds if r in x.prefix) for r in rids}
    assert first["s0"] == 0
    assert min(first["s1"], first["s2"]) >= 12 * G  # the fork, not the learned 3 G
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}


def test_both_uses_a_declaration_when_there_is_one_else_what_it_learned():
    G = grid_of()
    system = 3 * G + 10
    kit = make("radixflow", "both")
    declared = gsp_paced(kit, 2, 4, system, G + 3, declare=True, seed=1)
    assert followers_without_hit(declared) == 0
    learned = gsp_paced(kit, 2, 4, system, G + 3, declare=False, seed=2)
    assert followers_without_hit(learned) == 0  # NOTE: the declared groups taught it 3 G
    assert kit.runtime.boundary.moved == {"declared": 2, "learned": 2, "marker": 0, "repeat": 0,
                                             "queued_fork": 0, "fork_mark": 0}


def test_learned_leaves_continuations_and_repeats_alone():
    """Multi-turn continuations and exact repeats hit the states earlier requests published
    at their ends: nothing forks, nothing moves, every hit equals stock's."""
    G = grid_of()
    rng = random.Random(3)
    hits = {}
    for name in ("stock", "learned"):
        kit = make("stock") if name == "stock" else make("radixflow", "learned")
        conv = [rng.randrange(100, 200_000) for _ in range(3 * G + 10)]
        got = []
        for t in range(4):
            conv += [rng.randrange(100, 200_000) for _ in range(G + 5 * t + 3)]
            got.append(run_one(kit, f"t{t}", list(conv))[0])
            got.append(run_one(kit, f"t{t}-again", list(conv))[0])
            conv.append(7)
        hits[name] = got
        if name == "learned":
            assert kit.runtime.boundary.moved["learned"] == 0
        rng = random.Random(3)
    assert hits["learned"] == hits["stock"] and hits["stock"][1] > 0


# --- what moving the state costs later requests ---------------------------------------------------


def _turns(kit, G: int, system: int, repeat: bool):
    """A first turn declaring its system prompt, then its exact repeat or its next turn."""
    rng = random.Random(9)
    conv = [rng.randrange(100, 200_000) for _ in range(system)]
    conv += [rng.randrange(100, 200_000) for _ in range(2 * G + 7)]
    first = run_one(kit, "t0", list(conv), boundary=system)
    if not repeat:
        conv += [7] + [rng.randrange(100, 200_000) for _ in range(G)]
    return first, run_one(kit, "t1", list(conv), boundary=system)


@pytest.mark.parametrize("repeat", [False, True])
def test_moving_the_state_costs_a_continuation_its_tail(repeat):
    """extra_buffer keeps one state per extend: moved to the boundary, the next turn (or an
    exact repeat) resumes at the boundary instead of the first turn's end: it recomputes the
    tail (the price of the move; no rule keeps the end: `keep_end` went, issue 50)."""
    G = grid_of()
    system = 3 * G + 10
    stock = _turns(make("stock"), G, system, repeat)
    moved = _turns(make("radix", "declared"), G, system, repeat)
    end = (system + 2 * G + 7) // G * G
    assert stock[1][0] == end  # stock resumes at the first turn's end state
    assert moved[1][0] == 3 * G  # moved: at the boundary
    assert moved[1][1] - stock[1][1] == end - 3 * G  # the tail, recomputed


# --- the request field's validation (tokenizer manager: a 400 naming the field) ------------------


def test_boundary_field_problems_name_the_field():
    from types import SimpleNamespace

    import orjson

    from radixflow_sglang.adapter.boundary import FIELD_PATH, boundary_problem

    def obj(value):
        return SimpleNamespace(sampling_params={"custom_params": {"radixflow_boundary": value}})

    ids = list(range(10))
    assert boundary_problem(obj(4), ids) is None and boundary_problem(obj(0), ids) is None
    assert boundary_problem(obj(10), ids) is None
    assert boundary_problem(SimpleNamespace(sampling_params={}), ids) is None
    for bad in ("4", 4.0, True, None, [4]):
        msg = boundary_problem(obj(bad), ids)
        assert msg.startswith(FIELD_PATH) and "integer" in msg and "[0, 10]" in msg
    for bad in (-1, 11):
        assert boundary_problem(obj(bad), ids) == f"{FIELD_PATH}: {bad} is outside [0, 10] " \
                                                  "(the input's token count)"
    # NOTE: SGLang's JSON parser (orjson) hands an integer beyond 64 bits over as a float
    big = orjson.loads(b"1000000000000000000000000000000")
    assert isinstance(big, float)
    assert boundary_problem(obj(big), ids) == f"{FIELD_PATH}: 1e+30 is outside [0, 10] " \
                                              "(the input's token count)"
    for params in ("abc", [1, 2], 7):
        msg = boundary_problem(SimpleNamespace(sampling_params={"custom_params": params}), ids)
        assert msg == f"sampling_params.custom_params: {params!r} is not an object; allowed: " \
                      'a JSON object (e.g. {"radixflow_boundary": 2048}) or null'
    assert boundary_problem(SimpleNamespace(sampling_params={"custom_params": None}), ids) is None


def test_the_setting_names_the_flag_and_the_choices():
    from radixflow_sglang.config import FLAG_NAMES, VAR_NAMES, ConfigError, RadixFlowConfig, build

    assert RadixFlowConfig().boundaries == "both"
    with pytest.raises(ConfigError, match="RadixFlowConfig.boundaries: invalid choice 'x' "
                                          r"\(choose from off, declared, learned, both\)"):
        RadixFlowConfig(boundaries="x")
    with pytest.raises(ConfigError, match="^--radixflow-boundaries: invalid choice 'sometimes'"):
        build({"boundaries": "sometimes"}, FLAG_NAMES)
    with pytest.raises(ConfigError, match="^RADIXFLOW_BOUNDARIES: invalid choice"):
        build({"boundaries": "all"}, VAR_NAMES)
    assert build({"boundaries": "both"}, FLAG_NAMES).boundaries == "both"


# --- a real server: the field from /generate and the OpenAI endpoints -----------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    import os
    import sys

    from radixflow_sglang.testing.server import Server, free_port

    root = Path(__file__).resolve().parent.parent
    tmp = tmp_path_factory.mktemp("boundary-server")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RADIXFLOW_")}
    env.update(PYTHONUNBUFFERED="1", SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_IDLE="1")
    cmd = [sys.executable, "-m", "radixflow_sglang.launch_server", "--host", "127.0.0.1",
           "--port", str(port), "--radixflow-policy", "radixflow", "--radixflow-boundaries",
           "declared", "--radixflow-chat-boundary", "on", "--radixflow-executor", "simulated"]
    with Server(cmd, env, tmp / "server.log", port, cwd=root) as srv:
        srv.wait_ready(400)
        yield srv


def _post(url: str, body: dict):
    import json
    import urllib.error
    import urllib.request

    req = urllib.request.Request(url, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _moved(server) -> int:
    from radixflow_sglang.testing.server import http_json

    info = http_json(server.base + "/server_info", timeout=120)
    states = info.get("internal_states") or [info]
    return sum(s["radixflow"]["boundaries"]["moved_declared"] for s in states)


@pytest.mark.slow
def test_server_field_400_on_a_bad_value_and_a_hit_on_a_good_one(server):
    from radixflow_sglang.adapter.boundary import FIELD_PATH
    from radixflow_sglang.models import DEFAULT

    G = grid_of(DEFAULT)
    system = list(range(2000, 2000 + 3 * G + 10))

    def gen(ids, boundary):
        sp = {"max_new_tokens": 1, "ignore_eos": True,
              "custom_params": {"radixflow_boundary": boundary}}
        return _post(server.base + "/generate", {"input_ids": ids, "sampling_params": sp})

    for bad in ("x", -1, 10_000, True):
        status, body = gen(system + [5] * 3, bad)
        assert status == 400 and FIELD_PATH in str(body), (bad, status, body)
    status, body = _post(server.base + "/v1/completions",
                         {"model": "default", "prompt": system, "max_tokens": 1,
                          "custom_params": {"radixflow_boundary": "end"}})
    assert status == 400 and FIELD_PATH in str(body), body
    before = _moved(server)
    status, first = gen(system + list(range(90_000, 90_000 + G + 3)), len(system))
    assert status == 200, first
    assert _moved(server) == before + 1
    status, second = gen(system + list(range(95_000, 95_000 + G + 3)), len(system))
    assert status == 200, second
    # NOTE: stock gives the second sibling 0 cached tokens on this shape (kit test above)
    assert second["meta_info"]["cached_tokens"] >= len(system) // G * G
    status, body = _post(server.base + "/v1/completions",
                         {"model": "default", "prompt": system + [11] * (G + 3),
                          "max_tokens": 1, "custom_params": {"radixflow_boundary": len(system)}})
    assert status == 200, body
    server.check_alive("after the boundary requests")
    server.idle_leak_check()


@pytest.mark.slow
def test_server_chat_declares_the_system_message_end(server):
    before = _moved(server)
    sysmsg = {"role": "system", "content": "You answer briefly and exactly. " * 30}
    for q in ("What is 2 + 2?", "Name a prime number."):
        status, body = _post(server.base + "/v1/chat/completions",
                             {"model": "default", "max_tokens": 1,
                              "messages": [sysmsg, {"role": "user", "content": q}]})
        assert status == 200, body
    assert _moved(server) == before + 1  # the first publishes at the system message's end
    server.idle_leak_check()


# --- figures at the shape (not a test: `PYTHONPATH=. python tests/test_boundary.py`) -----


def docs_with_turns(kit, groups: int, seed: int = 4, declare: bool = False):
    """Rare forks, frequent continuations: each group is a 1,024-token prompt + a 2,000-token
    document, its next turn, and (one group in three) a sibling sharing only the prompt."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(100, 200_000) for _ in range(1024)]
        first = prompt + [rng.randrange(100, 200_000) for _ in range(2000)]
        b = 1024 if declare else None
        out.append((g, 0, *run_one(kit, f"d{g}", first, boundary=b)))
        turn = first + [7] + [rng.randrange(100, 200_000) for _ in range(100)]
        out.append((g, 1, *run_one(kit, f"d{g}t", turn, boundary=b)))
        if g % 3 == 2:
            sib = prompt + [rng.randrange(100, 200_000) for _ in range(2000)]
            out.append((g, 2, *run_one(kit, f"d{g}s", sib, boundary=b)))
    return out


# --- learned document ends (issue 11: the second question on a document) ---------------------
def test_markers_merge_to_the_template_text_and_find_its_last_occurrence():
    ml = MarkerLearner(span=6)
    end = [11, 12, 21, 22]  # "\n\n" + "Question:"
    a = [1, 2, 3, 4, 5, 6, 7] + end + [90, 91]
    b = [8, 9, 10, 13, 14] + end + [92]
    ml.observe(a, 11)
    first = ml.markers[0]
    assert ml.candidates(a, 0, len(a)) == [(11, first)]  # one fork's own 6 tokens: specific
    assert ml.candidates(b, 0, len(b)) == []  # ... another document's end is not found
    m = ml.observe(b, 9)
    assert m.tokens == tuple(end) and m.support == 2  # what two documents share there
    new = [5, 6] + end + [30] * 40 + end + [31, 32]
    assert ml.candidates(new, 0, len(new)) == [(50, m)]  # the last occurrence, right after it
    assert ml.candidates(new, 0, 49) == [(6, m)]
    assert ml.observe([40, 41, 42], 3).support == 1  # no common suffix: a new candidate
    assert ml.observe([1, 2], 1) is None  # shorter than min_len


def test_place_moves_to_the_document_end_only_when_it_serves_more():
    # 3 queued siblings share to 6,272, a future question (usage 1) to the document's 6,208
    assert place(0, 6_336, [(6_208, 1.0), (6_272, 1), (6_272, 1), (6_272, 1)]) == 6_208
    # a marker never reused: the siblings' fork keeps the state (None: not moved)
    assert place(0, 6_336, [(6_208, 0.01), (6_272, 1), (6_272, 1), (6_272, 1)]) == 6_272
    # no sibling, no continuation: the document end
    assert place(0, 6_336, [(6_208, 0.5), (6_336, 0.0)]) == 6_208
    # continuations of the end outweigh a rarely reused marker: keep the end
    assert place(0, 640, [(64, 0.2), (640, 1.0)]) is None
    assert place(0, None, [(64, 1.0)]) is None


@pytest.mark.parametrize("layout", LAYOUTS)
def test_second_question_hits_the_document_end_learned_from_other_documents(layout):
    """Two documents' second questions teach "\n\nQuestion:"; from then on a document's first
    question publishes its state at its own document end, and the second question resumes
    there (stock and the depth-only learner: nothing or another document's depth)."""
    G = grid_of()
    kit = make("radixflow", "learned", layout)
    res = doc_questions(kit, 5, 2)
    later = [(D, ready) for d, q, D, ready, _ in res if d >= 3 and q == 1]
    # NOTE: the divergence lies after "Question:" (2 tokens into the question piece); a no_buffer
    # chunk ends on it (page 1), an extra_buffer tracked state on its grid floor
    exact = layout == "no_buffer"
    assert later == [(D, D + 2 if exact else (D + 2) // G * G) for D, _ in later]
    moved = kit.runtime.boundary.moved
    assert moved["marker"] + moved["fork_mark"] >= 2  # NOTE: no_buffer: cuts at the fork
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}
    stock = doc_questions(make("stock", layout=layout), 5, 2)
    assert all(ready == 0 for d, q, _, ready, _ in stock if d >= 3)
    assert sum(r[4] for r in res) < sum(r[4] for r in stock)



# --- template pieces: the document end before any fork shows it (`MarkerLearner.infer`) -----
END = [11, 12, 21, 22]  # "\n\n" + "Question:"


def _tail(doc: list[int], question: list[int], option: list[int]) -> list[int]:
    return doc + END + question + [31, 32] + option + [41, 42, 43]  # [41, 42, 43]: a check


def test_common_runs_are_bounded_template_text_and_related_tails_teach_nothing():
    a = (1, 2, 3) + tuple(END) + (4, 5, 31, 32, 6, 41, 42, 43)
    b = (7, 8) + tuple(END) + (9, 31, 32, 10, 11, 41, 42, 43)
    # "\n\nQuestion:" is followed by different text in both; the check ends both: not a piece;
    # [31, 32] is shorter than 3 tokens
    assert common_runs(a, b, 3) == [tuple(END)]
    sibling = a[2:-4] + (50, 41, 42, 43)  # shares text reaching the start of the window
    assert common_runs(sibling, a, 3) is None
    assert common_runs(a[3:], a, 3) is None
    assert common_runs((1, 2, 3), (4, 5, 6), 3) == []
    assert longest_common_run((9, 11, 12, 21, 22, 5), (11, 12, 21, 22, 7)) == (4, 1)


def test_pieces_from_two_documents_find_the_third_documents_end():
    ml = MarkerLearner(window=32)
    rng = random.Random(0)

    def rand(n: int) -> list[int]:
        return [rng.randrange(1000, 200_000) for _ in range(n)]

    q0 = _tail(rand(40), rand(8), rand(5))
    assert ml.infer(q0) == [] and ml.pieces == []  # nothing to compare with yet
    sib = q0[:-8] + rand(5) + [41, 42, 43]
    assert ml.infer(sib) == [] and len(ml._tails) == 1  # a sibling: related, not kept
    assert ml.markers == []  # NOTE: forks are the tree's to show (`observe`)
    assert ml.infer(q0) == []  # the same request again (its next chunk)
    q1 = _tail(rand(50), [7] + rand(8), rand(6))
    touched = ml.infer(q1)
    assert [m.tokens for m in touched] == [tuple(END)] and touched[0].support == 1
    doc = rand(60)
    new = _tail(doc, [7] + rand(9), rand(4))  # its question starts as q1's did
    assert ml.candidates(new, 0, len(new)) == [(len(doc) + 4, touched[0])]
    assert ml.candidates(new, 0, len(new), pieces=False) == []  # no_buffer: markers only
    ml.infer(new)  # the run is END + [7]: it merges into END (what the documents share)
    assert ml.pieces[0].tokens == tuple(END) and ml.pieces[0].support == 3
    assert ml.candidates(new, 0, len(doc) + 3) == []  # not in the extend: no candidate


def test_pieces_count_once_per_pair_and_need_support():
    ml = MarkerLearner(window=64, piece_support=2)
    a = [100, 101] + END + [1, 2, 3, 4] + END + [5, 6, 7, 41, 42, 43]
    b = [200, 201] + END + [8, 9, 10] + [41, 42, 43, 44]
    ml.infer(a)
    ml.infer(b)  # END occurs twice in a: still one pair
    assert [(m.tokens, m.support) for m in ml.pieces] == [(tuple(END), 1)]
    assert ml.candidates(b, 0, len(b)) == []  # support 1 < 2
    ml.infer([300, 301] + END + [12, 13, 41, 42, 43])
    assert ml.pieces[0].support == 3 and ml.candidates(b, 0, len(b)) == [(6, ml.pieces[0])]


def test_candidates_kept_for_a_request_until_the_learner_learns():
    """Asked again under a request's key (PLACE, then its no_buffer mark), the candidates are
    the ones found, the markers' part without pieces; a learning step forgets them."""
    ml = MarkerLearner(window=64, piece_support=2)
    ctx = [900, 901, 902, 903]
    m = ml.observe(ctx + [1], len(ctx))  # a fork after ctx: a marker (support 1: learned)
    ml.infer([100, 101] + END + [1, 2, 3, 4] + END + [5, 6, 7, 41, 42, 43])
    ml.infer([200, 201] + END + [8, 9, 10] + [41, 42, 43, 44])  # END: one pair, not learned
    new = [7, 8] + ctx + [9] + END + [10, 11]
    assert ml.candidates(new, 0, len(new), key=("r", len(new))) == [(6, m)]
    ml.infer([300, 301] + END + [12, 13, 41, 42, 43])  # END's next pairs: learned now
    both = [(6, m), (7 + len(END), ml.pieces[0])]
    assert ml.candidates(new, 0, len(new), key=("r", len(new))) == both
    assert ml.candidates(new, 0, len(new)) == both  # the same as unkept
    assert ml.candidates(new, 0, len(new), pieces=False, key=("r", len(new))) == [(6, m)]
    assert ml.candidates(new, 0, 6, key=("r", len(new))) == [(6, m)]  # another extend


def test_a_document_asked_in_another_namespace_shows_its_end_in_token_space():
    """Two questions on one document in different namespaces (the matrix's cold segment asks
    each in its own): the tree shows no fork between them, their tails do. Where their shared
    text ends is a piece (the document's last tokens and the template's), used as a marker by
    the next request with that document; within one namespace the fork is the tree's."""
    ml = MarkerLearner(window=32)
    rng = random.Random(1)

    def rand(n: int) -> list[int]:
        return [rng.randrange(1000, 200_000) for _ in range(n)]

    doc = rand(40)
    q0 = _tail(doc, rand(8), rand(5))
    assert ml.infer(q0, "cold/q0") == []
    sib = q0[:-8] + rand(5) + [41, 42, 43]
    assert ml.infer(sib, "cold/q0") == [] and ml.pieces == []  # the tree shows its fork
    q1 = _tail(doc, rand(9), rand(6))
    assert ml.infer(q1, "cold/q0") == [] and ml.pieces == []  # one namespace: the tree's
    touched = ml.infer(q1, "cold/q1")
    end = len(doc) + len(END)  # NOTE: the questions diverge right after "Question:"
    assert [m.tokens for m in touched] == [tuple((doc + END)[-(32 - (len(q1) - end)):])]
    assert len(ml._tails) == 1  # related: not kept
    q2 = _tail(doc, rand(7), rand(4))
    assert ml.candidates(q2, 0, len(q2)) == [(end, touched[0])]
    assert ml.candidates(q2, 0, len(q2), pieces=False) == []  # no_buffer admission: markers
    other = _tail(rand(40), rand(8), rand(5))
    assert ml.candidates(other, 0, len(other)) == []  # the piece holds this document's text
    assert ml.infer(q2, None) == []  # NOTE: no namespace given: related, nothing learned
    # the run ends where both go on differently; a prefix or an identical prompt is no fork
    a, b = (3, 4, 5, 6, 1), (9, 3, 4, 5, 7, 8)  # a's window starts inside the shared text
    assert shared_run_end(a, b, 3) == 3 and shared_run_end(b, a, 3) == 4
    assert shared_run_end((1, 3, 4, 5, 6), b, 3) is None  # no run touches a window's start
    assert shared_run_end(a, a, 3) is None and shared_run_end(a, a + (7,), 3) is None


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_document_asked_in_other_namespaces_has_its_end_published_in_a_shared_one(layout):
    """The matrix's qwen3.5-0.8b QuALITY cell of seed 1 (every question on one document): the
    cold segment asks each question in its own namespace, so no tree fork and no unrelated
    document teach where the document ends; the mixed segment's first question then published
    at its siblings' fork and the second recomputed the document (p95 1.057x stock). The token
    fork of the cold questions is that end: the shared namespace's first question publishes
    there and the second resumes at it (extra_buffer: its grid floor; no_buffer: the traversal
    cuts its first question there for the siblings that wait anyway)."""
    G = grid_of()
    rng = random.Random(3)

    def rand(n: int) -> list[int]:
        return [rng.randrange(1000, 200_000) for _ in range(n)]

    doc = [5, 6] + rand(6 * G + 17) + [11, 12]
    questions = [[21, 22] + rand(G // 2 + 5 * q) + [31, 32] for q in range(4)]
    ready = {}
    for policy in ("stock", "radixflow"):
        kit = make(policy, "both", layout)
        for q, ns in enumerate(["cold/q0", "cold/q1", "shared", "shared"]):
            rids = [f"{policy}{q}{k}" for k in "ABCD"]
            for k, rid in enumerate(rids):
                kit.submit(kit.req(rid, doc + questions[q] + rand(6 + k) + [41, 42, 43], ns))
            rounds = kit.drain()
            ready[policy, q] = min(next(r.prefix[x] for r in rounds if x in r.prefix)
                                   for x in rids)
        assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}
    end = len(doc) + 2  # NOTE: "Question:" is shared, the question's text diverges
    assert ready["radixflow", 3] == (end // G * G if layout == "extra_buffer" else end)
    assert ready["stock", 3] < end - G  # stock: the first question's state lies past the end


@pytest.mark.parametrize("layout", LAYOUTS)
def test_second_question_hits_the_document_end_inferred_before_any_fork(layout):
    """No same-document question ran before: the template piece after the document comes from
    two other documents' questions (`infer`). extra_buffer: the second document's first
    question already moves its one state to its own document end and its second question
    resumes there. no_buffer: publishing there costs a cut (a round), which a guessed piece
    never makes at admission; but the first question's siblings wait for its fork cut anyway,
    and that cut goes to the document end (`Producer.mark`): the same rounds, and the second
    question resumes at the exact document end from the second document on."""
    G = grid_of()
    kit = make("radixflow", "learned", layout)
    res = doc_questions(kit, 4, 2)
    pub = kit.runtime.boundary
    # NOTE: before document 1's first question only document 0's own fork was seen (its 16
    # tokens are document 0's): without the piece, document 1's second question resumed at 0
    assert [p.tokens for p in pub.markers.pieces] == [tuple(END)]
    second = {d: (D, ready) for d, q, D, ready, _ in res if q == 1}
    if layout == "extra_buffer":
        assert all(second[d] == (D, (D + 2) // G * G) for d, (D, _) in second.items() if d)
    else:
        assert all(second[d] == (D, D + 2) for d, (D, _) in second.items() if d)
        assert pub.moved["fork_mark"] >= 3 and pub.unpaid == 0
    assert kit.leaks() == {"kv": 0, "rows": 0, "mamba": 0}

def figures() -> None:
    """Counts of followers with 0 cached tokens, scheduled tokens and rounds vs stock."""
    shape = dict(groups=16, per_group=4, system=2048, question=64)
    arms = [("stock", "stock", "off", {}, False),
            ("declared", "radixflow", "declared", {}, True),
            ("learned (optimal)", "radixflow", "learned", {"rule": "optimal"}, False),
            ("learned (mode)", "radixflow", "learned", {"rule": "mode"}, False)]
    for layout in LAYOUTS:
        base = None
        for name, policy, mode, pub, declare in arms:
            kit = make(policy, mode, layout, **pub)
            res = gsp_paced(kit, **shape, declare=declare)
            tokens = sum(r[3] for r in res)
            base = base or (tokens, len(kit.rounds))
            print(f"gsp-paced 16x4 2048+64 {layout:12s} {name:18s} followers with 0 cached: "
                  f"{followers_without_hit(res)}/48  scheduled tokens {tokens} "
                  f"({tokens / base[0]:.3f}x)  rounds {len(kit.rounds)} "
                  f"({len(kit.rounds) / base[1]:.3f}x)", flush=True)
        base = None
        for name, policy, mode, pub, _ in arms[:1] + arms[2:]:
            kit = make(policy, mode, layout, **pub)
            res = docs_with_turns(kit, 24)
            tokens = sum(r[3] for r in res)
            base = base or (tokens, len(kit.rounds))
            print(f"docs+turns 24 groups {layout:12s} {name:18s} "
                  f"scheduled tokens {tokens} ({tokens / base[0]:.3f}x)  rounds "
                  f"{len(kit.rounds)} ({len(kit.rounds) / base[1]:.3f}x)", flush=True)


if __name__ == "__main__":
    figures()


def _runs_by_scan(a: tuple, b: tuple, k: int) -> list | None:
    """`common_runs` token by token over every position pair (the reference)."""
    runs = []
    for j in range(len(b) - k + 1):
        for i in range(len(a) - k + 1):
            if a[i:i + k] != b[j:j + k] or (i and j and a[i - 1] == b[j - 1]):
                continue
            if i == 0 or j == 0:
                return None
            n = k
            while i + n < len(a) and j + n < len(b) and a[i + n] == b[j + n]:
                n += 1
            if i + n < len(a) and j + n < len(b):
                runs.append(a[i:i + n])
    return runs


def _shared_end_by_scan(a: tuple, b: tuple, k: int) -> int | None:
    """`shared_run_end` token by token over every position pair (the reference)."""
    best, at = 0, None
    for j in range(len(b) - k + 1):
        for i in range(len(a) - k + 1):
            if (i and j) or a[i:i + k] != b[j:j + k]:
                continue
            n = k
            while i + n < len(a) and j + n < len(b) and a[i + n] == b[j + n]:
                n += 1
            if i + n < len(a) and j + n < len(b) and n > best:
                best, at = n, i + n
    return at


def _infer_by_scan(ml: MarkerLearner, tokens, namespace=None) -> list:
    """`MarkerLearner.infer` without its k-gram prechecks and indexes: every kept tail scanned
    token by token (the reference its shortcuts must equal)."""
    tail = tuple(tokens[-ml.window:])
    if len(tail) <= ml.min_len or tail in ml._tails:
        return []
    pairs = []
    for old, space in zip(reversed(ml._tails), reversed(ml._spaces), strict=True):
        runs = _runs_by_scan(tail, old, ml.min_len)
        if runs is None:
            if namespace is not None and space is not None and space != namespace:
                fork = _shared_end_by_scan(tail, old, ml.min_len)
                if fork is not None:
                    return [ml._merge_suffix(ml.pieces, tail[max(0, fork - ml.span):fork])]
            return []
        pairs.append(runs)
    ml._tails.append(tail)
    ml._spaces.append(namespace)
    ml._grams.append(frozenset())  # NOTE: unread here; kept aligned with the tails
    ml._index.append(None)
    if len(ml._tails) > ml.keep:
        ml._tails.popleft(), ml._spaces.popleft(), ml._grams.popleft(), ml._index.popleft()
    touched: list = []
    for runs in pairs:
        seen: set[int] = set()
        for run in runs:
            m = ml._piece(run, seen)
            if m is not None and all(m is not t for t in touched):
                touched.append(m)
    return touched


@pytest.mark.parametrize("seed", range(6))
def test_infer_prechecks_equal_the_full_scan(seed):
    """Unrelated tails (no common k-gram) and related ones (a common run at a window's start)
    are decided without the scan; the pieces learned, their support and every answer are the
    scan's, over a stream of documents, siblings, repeats and namespaces."""
    rng = random.Random(seed)
    fast, slow = MarkerLearner(window=48), MarkerLearner(window=48)

    def rand(n: int) -> list[int]:
        return [rng.randrange(1000, 1400) for _ in range(n)]  # NOTE: small alphabet: chance runs

    docs = [rand(rng.randrange(10, 60)) for _ in range(5)]
    for _ in range(60):
        doc = rng.choice(docs)
        req = _tail(doc, [7] + rand(rng.randrange(3, 12)), rand(rng.randrange(2, 8)))
        ns = rng.choice([None, "a", "b"])
        got, want = fast.infer(req, ns), _infer_by_scan(slow, req, ns)
        assert [(m.tokens, m.support) for m in got] == [(m.tokens, m.support) for m in want]
        assert [(m.tokens, m.support) for m in fast.pieces] == [
            (m.tokens, m.support) for m in slow.pieces]
        assert list(fast._tails) == list(slow._tails)
    assert fast.pieces  # NOTE: the stream taught pieces: the comparison covered runs


@pytest.mark.parametrize("seed", range(4))
def test_runs_over_the_common_kgrams_equal_the_pass_over_the_tail(seed):
    """`common_runs` (with or without both k-gram indexes and the common k-grams: what `infer`
    passes) and `shared_run_end` answer as the token-by-token scan of every position pair."""
    rng = random.Random(seed)
    answers = set()
    for _ in range(300):
        a, b = (tuple(rng.randrange(0, 5) for _ in range(rng.randrange(3, 60)))
                for _ in range(2))
        ia, ib = _kgram_index(a, 3), _kgram_index(b, 3)
        common = frozenset(ia) & frozenset(ib)
        want = _runs_by_scan(a, b, 3)
        assert common_runs(a, b, 3) == want
        assert common_runs(a, b, 3, ia, ib, common) == want
        assert shared_run_end(a, b, 3) == _shared_end_by_scan(a, b, 3)
        answers.add("none" if want is None else len(want))
    assert {"none", 0, 1, 2} <= answers  # NOTE: related, unrelated and runs all exercised
