"""CPU kit: SGLang 0.5.23's real pools, cache, Req and scheduler scan, built without a GPU or model.

Follows `sglang/test/kits/unified_radix_cache/fixtures.py::build_fixture` for the pools and cache.
The scheduler is the real class (stock, or ours) created with `__new__` plus the attributes
its prefill scan reads; only objects the scan asks about a model or a worker are stand-ins
(`_Stub` below, each named). A round = stash the chunked request (as `get_next_batch_to_run`),
run the scan, and complete the batch through the result path's calls (`release_kv_cache` /
`checkpoint_kv_cache`, as `process_batch_result_prefill`). Recurrent state tensors are shrunk
(the scan never reads their contents); layer layout and the checkpoint grid are the model's.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace

from radixflow_sglang.adapter import check_sglang_version
from radixflow_sglang.adapter.pools import cpu_pools
from radixflow_sglang.geometry import Geometry, load_geometry

check_sglang_version()

from sglang.srt.environ import envs  # noqa: E402
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req, ScheduleBatch  # noqa: E402
from sglang.srt.managers.schedule_policy import SchedulePolicy  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

LAYOUTS = ("extra_buffer", "no_buffer")
CONTEXT_LEN = 32_768  # the pools' max_context_len


@dataclass
class KitConfig:
    model: str = "qwen3.5-4b"
    layout: str = "extra_buffer"  # ignored for full attention
    rows: int | None = None  # max running requests; default: the model's paper budget S
    tokens: int | None = None  # chunked_prefill_size = max_prefill_tokens; default T
    kv_tokens: int = 400_000  # KV pool capacity in tokens
    mamba_slots: int | None = None  # default: enough for rows, ping-pong buffers and the tree
    schedule_policy: str = "fcfs"
    overlap: bool = False  # publish lag of overlap scheduling (result processed one round late)
    tree_core: str = "python"
    disable_radix_cache: bool = False  # --disable-radix-cache: the same cache with disable=True
    page_size: int = 1  # KV page (ServerArgs.page_size); no_buffer allows only 1 (as SGLang)


@dataclass
class Pools:
    req_to_token: ReqToTokenPool
    allocator: object  # TokenToKVPoolAllocator
    cache: UnifiedRadixCache
    server_args: ServerArgs


def check_page_size(cfg: KitConfig, geo: Geometry) -> None:
    """SGLang's own start-up checks on page_size for this layout (mamba_hook.py
    `validate_mamba_no_buffer`, overrides.py `mamba_cache_chunk_size`)."""
    page = cfg.page_size
    if not isinstance(page, int) or page < 1:
        raise ValueError(f"KitConfig.page_size: {page!r} (a positive integer)")
    if not geo.hybrid or page == 1:
        return
    if cfg.layout == "no_buffer":
        raise ValueError(f"KitConfig.page_size: {page} with layout no_buffer (SGLang: "
                         f"no_buffer only supports page_size=1; use extra_buffer)")
    if max(geo.grid, page) % min(geo.grid, page):
        raise ValueError(f"KitConfig.page_size: {page} (SGLang: the mamba chunk size "
                         f"{geo.grid} and the page size must divide one another)")


def mamba_chunk(cfg: KitConfig, geo: Geometry) -> int:
    """SGLang's `mamba_cache_chunk_size`: max(the model's mamba chunk, page_size)."""
    return max(geo.grid, cfg.page_size)


def build_server_args(cfg: KitConfig, geo: Geometry) -> ServerArgs:
    tokens = cfg.tokens or geo.tokens
    args = ServerArgs(
        model_path="dummy",
        page_size=cfg.page_size,
        chunked_prefill_size=tokens,
        max_prefill_tokens=tokens,
        max_running_requests=cfg.rows or geo.rows,
        schedule_policy=cfg.schedule_policy,
        pp_max_micro_batch_size=cfg.rows or geo.rows,
        mamba_radix_cache_strategy=cfg.layout if geo.hybrid else "auto",
        disable_overlap_schedule=not cfg.overlap,
        disable_radix_cache=cfg.disable_radix_cache,
    )
    # NOTE: a dummy model has no HF config to read the grid from; preset it (as build_fixture).
    args._mamba_cache_chunk_size = mamba_chunk(cfg, geo)
    set_global_server_args_for_scheduler(args)
    return args


def build_pools(cfg: KitConfig, geo: Geometry) -> Pools:
    args = build_server_args(cfg, geo)
    rows = cfg.rows or geo.rows
    extra = geo.hybrid and cfg.layout == "extra_buffer"
    # NOTE: a full-attention kit keeps 2 KV layers: layer count changes no scheduling decision.
    r2t, _kv, alloc = cpu_pools(
        rows=rows + 2, tokens=cfg.kv_tokens, context=CONTEXT_LEN,
        num_layers=geo.num_layers if geo.hybrid else 2,
        mamba_layers=geo.mamba_layers if geo.hybrid else (),
        mamba_slots=cfg.mamba_slots or rows * 4 + 64, extra_buffer=extra,
        page_size=cfg.page_size,
        **({"speculative_num_draft_tokens": 3} if geo.hybrid else {}),
    )
    hybrid = (ComponentType.FULL, ComponentType.MAMBA)
    components = hybrid if geo.hybrid else (ComponentType.FULL,)
    params = CacheInitParams(
        req_to_token_pool=r2t, token_to_kv_pool_allocator=alloc, page_size=cfg.page_size,
        disable=cfg.disable_radix_cache,  # NOTE: as kv_cache_builder.py builds it (0.5.23)
        tree_components=components, enable_mamba_extra_buffer=extra,
    )
    with envs.SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND.override(cfg.tree_core):
        cache = UnifiedRadixCache(params=params)
    return Pools(r2t, alloc, cache, args)


class _Stub(SimpleNamespace):
    """A stand-in for a scheduler collaborator that the prefill scan only asks simple questions."""


def make_scheduler(cls: type[Scheduler], pools: Pools, cfg: KitConfig, geo: Geometry) -> Scheduler:
    """The real scheduler class without its constructor: the attributes the prefill scan reads."""
    s = cls.__new__(cls)
    args = pools.server_args
    rows = cfg.rows or geo.rows
    tokens = cfg.tokens or geo.tokens
    s.server_args = args
    s.req_to_token_pool = pools.req_to_token
    s.token_to_kv_pool_allocator = pools.allocator
    s.tree_cache = pools.cache
    s.page_size = cfg.page_size
    s.waiting_queue = []
    s.running_batch = ScheduleBatch(reqs=[], batch_is_full=False)
    s.chunked_req = None
    s.last_batch = None
    s.max_running_requests = rows
    s.max_prefill_tokens = tokens
    s.chunked_prefill_size = tokens
    s.dynamic_chunk_sizer = None
    s.max_prefill_bs = 0
    s.is_mixed_chunk = False
    s.enable_overlap = cfg.overlap
    s.enable_lora = False
    s.lora_drainer = None
    s.enable_priority_preemption = False
    s.enable_priority_scheduling = False
    s.priority_scheduling_preemption_threshold = 0
    s.is_hybrid_swa = False
    s.enable_hicache_storage = False
    s.enable_lmcache = False
    s.enable_hierarchical_cache = False
    s.enable_unified_cache_external_linker = False
    s.enable_hisparse = False
    s.truncation_align_size = None
    s.processed_tokens_counter = 0
    s.prefill_delayer = None
    s.min_free_slots_delayer = None
    s.dllm_config = None
    s.hisparse_coordinator = None
    s.spec_algorithm = SpeculativeAlgorithm.NONE
    s.policy = SchedulePolicy(
        cfg.schedule_policy, pools.cache, enable_hierarchical_cache=False,
        enable_priority_scheduling=False, schedule_low_priority_values_first=False,
    )
    # Stand-ins for the model/worker side (the scan only reads these fields).
    s.model_config = _Stub(vocab_size=248_320, is_encoder_decoder=False,
                           hf_text_config=_Stub(mamba_chunk_size=geo.grid))
    s.tp_worker = _Stub(model_runner=_Stub(attn_backend=_Stub(), prefill_aware_swa=False))
    s.grammar_manager = _Stub(has_waiting_grammars=lambda: False)
    s.beam_coordinator = _Stub(pending_member_rows=lambda batch: 0)
    s.new_token_ratio_tracker = _Stub(current=0.0)
    s.load_inquirer = _Stub(_get_num_pending_tokens=lambda chunk_deduct=0: 0)
    return s


def scheduler_class(policy: str, config=None) -> type[Scheduler]:
    """`stock` is SGLang's own class; every other policy is ours with its config bound."""
    if policy == "stock":
        return Scheduler
    from radixflow_sglang.adapter.runtime import RadixFlowConfig
    from radixflow_sglang.adapter.scheduler import RadixFlowScheduler

    cfg = config or RadixFlowConfig(policy=policy)
    return type(f"RadixFlowScheduler_{policy}", (RadixFlowScheduler,), {"radixflow_config": cfg})


@dataclass
class Round:
    index: int
    rids: list[str]
    extend: dict[str, int]  # rid -> tokens scheduled this round
    prefix: dict[str, int]  # rid -> ready prefix it started from
    track: dict[str, int | None]  # rid -> depth its state is published at (extra_buffer)
    chunked: str | None

    @property
    def scheduled_tokens(self) -> int:
        return sum(self.extend.values())


@dataclass(frozen=True)
class ScanTiming:
    """One scan as `Kit.step` ran it: the queue it saw and the process CPU time it took."""

    queued: int  # waiting requests when the scan began
    cpu_s: float  # process CPU time of the scan (checkpoint of a chunk + prefill scan)
    visited: int | None = None  # requests our runtime's scan visited (None: SGLang's own)


@dataclass
class Kit:
    """SGLang's real scheduler over real pools on CPU, driven round by round."""

    cfg: KitConfig = field(default_factory=KitConfig)
    policy: str = "stock"
    radixflow_config: object | None = None
    geometry: Geometry | None = None
    clock: Callable[[], float] | None = None  # the runtime's clock (the twin: virtual time)
    sleep: Callable[[float], None] | None = None  # what a holding scheduler waits with
    on_complete: Callable[[Req], None] | None = None  # after each request's completion
    on_scan: Callable[[ScanTiming], None] | None = None  # after each scan (step)
    keep_finished: bool = True  # keep completed Reqs in `finished` (a long soak keeps none)
    agreement: Callable | None = None  # how the hold shares rank 0's decision (default: local)

    def __post_init__(self) -> None:
        if self.cfg.layout not in LAYOUTS:
            raise ValueError(f"KitConfig.layout: {self.cfg.layout!r} (choose from "
                             f"{', '.join(LAYOUTS)})")
        self.geometry = self.geometry or load_geometry(self.cfg.model)
        check_page_size(self.cfg, self.geometry)
        self.pools = build_pools(self.cfg, self.geometry)
        cls = scheduler_class(self.policy, self.radixflow_config)
        self.sched = make_scheduler(cls, self.pools, self.cfg, self.geometry)
        self.sched.result_queue = deque()  # in-flight batches (overlap: processed one round late)
        if self.policy != "stock":  # NOTE: the runtime's collaborators (the twin: virtual time)
            given = {"clock": self.clock, "agreement": self.agreement}
            self.sched.init_radixflow(sleep=self.sleep or (lambda _s: None),
                                      **{k: v for k, v in given.items() if v is not None})
        self.rounds: list[Round] = []
        self.finished: dict[str, Req] = {}
        self.last_scan: ScanTiming | None = None
        self._kv_total = self.pools.allocator.available_size()
        self._mamba_total = self._mamba_free()
        self._rows_total = self.pools.req_to_token.available_size()

    @property
    def runtime(self):
        """The scheduler's RadixFlowRuntime (None for stock)."""
        return getattr(self.sched, "radixflow", None)

    # --- requests ----------------------------------------------------------------------------
    def req(self, rid: str, ids, namespace: str | None = None, max_new_tokens: int = 1) -> Req:
        """A Req, after the intake checks SGLang's front end makes before a request can reach
        the scheduler (tokenizer manager: empty input, input longer than the context)."""
        if len(ids) == 0:
            raise ValueError(f"request {rid!r}: input_ids cannot be empty")
        # NOTE: SGLang's cap (scheduler `max_req_input_len`): min(context, pool) - 1, less 5.
        limit = min(CONTEXT_LEN - 1, self.cfg.kv_tokens - 1) - 5
        if len(ids) > limit:
            raise ValueError(f"request {rid!r}: {len(ids)} input tokens exceed the limit {limit} "
                             f"(context {CONTEXT_LEN}, KV pool {self.cfg.kv_tokens} tokens)")
        sp = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
        sp.normalize(None)
        return Req(rid, "", array("q", ids), sp, vocab_size=self.sched.model_config.vocab_size,
                   extra_key=namespace)

    def submit(self, *reqs: Req) -> None:
        self.sched.waiting_queue.extend(reqs)

    def abort_waiting(self, rid: str) -> Req:
        """Abort a waiting (possibly parked) request as the scheduler does for queued aborts."""
        q = self.sched.waiting_queue
        req = next((r for r in q if r.rid == rid), None)
        if req is None:
            raise KeyError(f"abort_waiting: request {rid!r} is not waiting")
        q.remove(req)
        if req.kv.holds_mamba:  # NOTE: as scheduler.py `abort_request` does for queued requests
            release_kv_cache(req, self.pools.cache, checkpoint=False)
        self._forget(rid)
        return req

    # --- rounds ------------------------------------------------------------------------------
    def scan(self) -> ScheduleBatch | None:
        s = self.sched
        if s.chunked_req is not None and s.chunked_req.extend_end > s.chunked_req.prefix_len:
            checkpoint_kv_cache(s.chunked_req, self.pools.cache)  # as get_next_batch_to_run
        plan = s.get_new_batch_prefill(s.running_batch)  # NOTE: our override holds here
        s.running_batch = plan.running_batch
        return plan.batch_to_run

    def step(self) -> Round | None:
        """One scheduler iteration: scan, launch, process (the previous batch under overlap)."""
        queued = len(self.sched.waiting_queue)
        t = time.process_time()
        batch = self.scan()
        visited = self.runtime.stats.visited if self.runtime is not None else None
        self.last_scan = ScanTiming(queued, time.process_time() - t, visited)
        if self.on_scan is not None:
            self.on_scan(self.last_scan)
        rnd = self._record(batch) if batch is not None else None
        if batch is not None:
            self.sched.result_queue.append((batch, None))
        if self.sched.result_queue and (not self.cfg.overlap or batch is None
                                        or len(self.sched.result_queue) > 1):
            self.complete(self.sched.result_queue.popleft()[0])
        return rnd

    def complete(self, batch: ScheduleBatch) -> None:
        """Commit one token per request through the result path's cache calls
        (batch_result_processor.py `process_batch_result_prefill`)."""
        for req in batch.reqs:
            if (req.finished() and req.inflight_middle_chunks <= 0) or req.is_retracted:
                continue
            if req.inflight_middle_chunks > 0:
                req.inflight_middle_chunks -= 1  # a middle chunk: no token yet
                continue
            req.output_ids.append(7)
            req.update_finish_state()
            if not req.finished():  # NOTE: the kit has no decode loop; one token ends a request
                req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
            release_kv_cache(req, self.pools.cache, checkpoint=True)
            if self.keep_finished:
                self.finished[req.rid] = req
            self._forget(req.rid)
            if self.on_complete is not None:
                self.on_complete(req)
        if self.sched.chunked_req is not None and self.sched.chunked_req.finished():
            self.sched.chunked_req = None

    @property
    def busy(self) -> bool:
        """Requests wait, a chunk continues, or a launched batch awaits its result."""
        s = self.sched
        return bool(s.waiting_queue or s.chunked_req is not None or s.result_queue)

    def drain(self, max_rounds: int = 10_000) -> list[Round]:
        out = []
        for _ in range(max_rounds):
            if not self.busy:
                return out
            rnd = self.step()
            if rnd is not None:
                out.append(rnd)
        raise RuntimeError(f"not drained after {max_rounds} rounds")

    # --- accounting --------------------------------------------------------------------------
    def leaks(self) -> dict[str, int]:
        """Evict the whole tree once nothing runs; every slot must then be free (0 = no leak)."""
        cache = self.pools.cache
        if cache.supports_mamba():
            cache.evict(EvictParams(num_tokens=cache.full_evictable_size(),
                                    mamba_num=cache.mamba_evictable_size()))
        else:
            cache.evict(EvictParams(num_tokens=cache.full_evictable_size()))
        out = {
            "kv": self._kv_total - self.pools.allocator.available_size(),
            "rows": self._rows_total - self.pools.req_to_token.available_size(),
            "mamba": 0,
        }
        if self._mamba_total is not None:
            out["mamba"] = self._mamba_total - self._mamba_free()
        return out

    @property
    def mamba_total(self) -> int | None:
        """Mamba slots free when the kit was built (None: no mamba pool)."""
        return self._mamba_total

    def mamba_free(self) -> int | None:
        """Mamba slots free now (None: no mamba pool)."""
        return self._mamba_free()

    def _mamba_free(self) -> int | None:
        pool = getattr(self.pools.req_to_token, "mamba_pool", None)
        return None if pool is None else self.pools.req_to_token.mamba_allocator.available_size()

    def _record(self, batch: ScheduleBatch) -> Round:
        chunked = self.sched.chunked_req.rid if self.sched.chunked_req is not None else None
        rnd = Round(
            len(self.rounds), [r.rid for r in batch.reqs],
            {r.rid: r.extend_end - r.prefix_len for r in batch.reqs},
            {r.rid: r.prefix_len for r in batch.reqs},
            {r.rid: r.kv.mamba_last_track_seqlen for r in batch.reqs}, chunked,
        )
        self.rounds.append(rnd)
        return rnd

    def _forget(self, rid: str) -> None:
        if self.runtime is not None:
            self.runtime.forget(rid)
