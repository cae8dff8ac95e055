"""CPU kit: SGLang 0.5.23's real pools, cache, Req and scheduler scan, built without a GPU or model.

Follows `sglang/test/kits/unified_radix_cache/fixtures.py::build_fixture` for the pools and cache.
The scheduler is the real class (stock, or ours) created with `__new__` plus the attributes
its event loop reads; only objects that stand for a model, a worker or observability are
stand-ins (`_Stub` below, each named). A step is one iteration of SGLang's event loop
(scheduler.py `event_loop_normal` / `event_loop_overlap`): the real `get_next_batch_to_run`
(stash the chunked request, filter the last prefill batch and merge it into the running batch,
the prefill scan, else `update_running_batch`: check_decode_mem, retract_decode,
prepare_for_decode), launch, and the real result path (batch_result_processor.py
`SchedulerBatchResultProcessor.process_batch_result_prefill` / `_decode`) with the generated
ids a model would have sampled: the request's scripted output, else FILLER_ID. A prefill batch
runs when one forms, else one decode step of the running batch; with `KitConfig.mixed_chunk`
(`--enable-mixed-chunk`) the prefill batch carries the running batch's decode rows
(`Round.decoding`). Recurrent state tensors are shrunk (nothing reads their contents); layer
layout and the checkpoint grid are the model's.
"""

from __future__ import annotations

import time
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace

from radixflow_sglang.adapter import check_sglang_version
from radixflow_sglang.adapter.pools import cpu_pools
from radixflow_sglang.geometry import Geometry, load_geometry
from radixflow_sglang.testing.loop import VirtualClock

check_sglang_version()

import torch  # noqa: E402
from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: E402
from sglang.srt.environ import envs  # noqa: E402
from sglang.srt.managers.schedule_batch import Req, ScheduleBatch  # noqa: E402
from sglang.srt.managers.schedule_policy import SchedulePolicy  # noqa: E402
from sglang.srt.managers.scheduler import Scheduler  # noqa: E402
from sglang.srt.managers.scheduler_components.batch_result_processor import (  # noqa: E402
    SchedulerBatchResultProcessor,
)
from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import (  # noqa: E402
    NewTokenRatioTracker,
)
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import EvictParams  # noqa: E402
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache  # noqa: E402
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.unified_cache.components.base import ComponentType  # noqa: E402
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: E402
from sglang.srt.runtime_context import get_schedule  # noqa: E402
from sglang.srt.sampling.sampling_params import SamplingParams  # noqa: E402
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler  # noqa: E402
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402

LAYOUTS = ("extra_buffer", "no_buffer")
EXECUTORS = ("witness", "scripted")
CONTEXT_LEN = 32_768  # the pools' max_context_len
FILLER_ID = 7  # the generated id of a request without a scripted output


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
    # --enable-mixed-chunk: a prefill that forms while requests decode carries their decode
    # rows as one-token extends (schedule_batch.py `mix_with_running`; `Round.decoding`)
    mixed_chunk: bool = False


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
        enable_mixed_chunk=cfg.mixed_chunk,
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
    _pool_attrs(s, pools, cfg, geo)
    _feature_attrs(s)
    s.policy = SchedulePolicy(
        cfg.schedule_policy, pools.cache, enable_hierarchical_cache=False,
        enable_priority_scheduling=False, schedule_low_priority_values_first=False,
    )
    _worker_stubs(s, geo)
    _event_loop_attrs(s, cfg)
    return s


def _pool_attrs(s: Scheduler, pools: Pools, cfg: KitConfig, geo: Geometry) -> None:
    """The pools, the queue, the batches and the budgets the scan reads."""
    rows = cfg.rows or geo.rows
    tokens = cfg.tokens or geo.tokens
    s.server_args = pools.server_args
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
    # NOTE: as scheduler.py `Scheduler.init_chunked_prefill` derives it (0.5.23): mixed chunks
    # need chunked prefill; the flag is read from the published server args (build_server_args)
    s.is_mixed_chunk = s.chunked_prefill_size is not None and get_schedule().enable_mixed_chunk
    s.dynamic_chunk_sizer = None
    s.max_prefill_bs = 0
    s.enable_overlap = cfg.overlap


def _feature_attrs(s: Scheduler) -> None:
    """SGLang features the kit runs without: off (and their counters at zero), as a server
    without their flags has them. (`is_mixed_chunk`: KitConfig.mixed_chunk, `_pool_attrs`.)"""
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


def _worker_stubs(s: Scheduler, geo: Geometry) -> None:
    """Stand-ins for the model/worker side (the scan only reads these fields)."""
    s.model_config = _Stub(vocab_size=geo.vocab_size, is_encoder_decoder=False,
                           hf_text_config=_Stub(mamba_chunk_size=geo.grid),
                           self_opened_think_start_ids=None, think_end_ids=None)
    s.tp_worker = _Stub(model_runner=_Stub(attn_backend=_Stub(), prefill_aware_swa=False))
    s.grammar_manager = _Stub(has_waiting_grammars=lambda: False)
    s.beam_coordinator = _Stub(pending_member_rows=lambda batch: 0, commit_decode=lambda b: set(),
                               retire_group=lambda req: None)
    s.load_inquirer = _Stub(_get_num_pending_tokens=lambda chunk_deduct=0: 0)


def _event_loop_attrs(s: Scheduler, cfg: KitConfig) -> None:
    """What scheduler.py `get_next_batch_to_run` / `update_running_batch` read beyond the scan
    (set by `Scheduler.__init__` and its `init_*` helpers in a server)."""
    s.new_token_ratio_tracker = NewTokenRatioTracker.from_config()  # the real one
    s.disaggregation_mode = DisaggregationMode.NULL
    s.abort_on_priority_when_disabled = False  # read by _add_request_to_queue (retraction)
    s.max_queued_requests = None  # --max-queued-requests default
    s.scheduler_stage_metrics = None
    s._pending_chunked_abort_req = None
    s.prefill_decode_interval = 0  # --prefill-decode-interval default
    s._prefill_decode_interval_remaining = 0
    s.require_mlp_sync = False  # no DP attention
    s.enable_skip_finishing_decode = cfg.overlap  # set by event_loop_overlap
    s.forward_ct = 0
    s.decode_offload_manager = None
    s.last_batch = None
    # Stand-ins: DP attention sync, n-gram embeddings and metrics do nothing here.
    s.dp_attn_adapter = _Stub(maybe_prepare_mlp_sync_batch=lambda b, need_sync=False: b,
                              maybe_convert_decode_to_extend=lambda b: b)
    s.ngram_embedding_manager = _Stub(prepare_for_forward=lambda b, chunked_req=None: b)
    s.metrics_reporter = _Stub(num_retracted_reqs=0, enable_metrics=False,
                               num_generated_tokens=0, forward_ct_decode=0,
                               report_decode_stats=lambda *a, **k: None,
                               report_prefill_stats=lambda *a, **k: None)


def result_processor(s: Scheduler, overlap: bool) -> SchedulerBatchResultProcessor:
    """SGLang's real result processor (scheduler.py `init_batch_result_processor`); stand-ins
    for the worker, streaming and metrics."""
    return SchedulerBatchResultProcessor(
        is_generation=True, disaggregation_mode=DisaggregationMode.NULL, enable_overlap=overlap,
        enable_overlap_mlx=False, model_config=s.model_config,
        token_to_kv_pool_allocator=s.token_to_kv_pool_allocator, tree_cache=s.tree_cache,
        hisparse_coordinator=None, req_to_token_pool=s.req_to_token_pool,
        decode_offload_manager=None, metrics_collector=None, metrics_reporter=s.metrics_reporter,
        draft_worker=None, model_worker=_Stub(), logprob_result_processor=None,
        output_streamer=_Stub(stream_output=lambda *a, **k: None),
        beam_coordinator=s.beam_coordinator, abort_request=None)


@contextmanager
def _no_pinned_memory() -> Iterator[None]:
    """`prepare_for_decode` pins its mamba track mask (`.pin_memory()`), which needs a CUDA
    driver; on the kit's CPU tensors pinning is the identity."""
    orig = torch.Tensor.pin_memory
    torch.Tensor.pin_memory = lambda self, *a, **k: self
    try:
        yield
    finally:
        torch.Tensor.pin_memory = orig


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
    """A launched prefill batch (`Kit.rounds`). Its prefill rows are `rids` (with `extend`,
    `prefix`, `track`); with `KitConfig.mixed_chunk` it may also carry the running batch's
    decode rows (`decoding`: scheduler.py `get_new_batch_prefill` -> schedule_batch.py
    `mix_with_running`, the batch's `decoding_reqs`), each a one-token extend at
    seq_len - 1: a decode step of its request, not a chunk of its prompt."""

    index: int
    rids: list[str]  # the prefill rows (a mixed batch's decode rows: `decoding`)
    extend: dict[str, int]  # rid -> tokens scheduled this round
    prefix: dict[str, int]  # rid -> ready prefix it started from
    track: dict[str, int | None]  # rid -> depth its state is published at (extra_buffer)
    chunked: str | None
    mode: str = "prefill"
    # rid -> KV entries its decode row reads (its sequence length, as DecodeRound.cached)
    decoding: dict[str, int] = field(default_factory=dict)

    @property
    def scheduled_tokens(self) -> int:
        return sum(self.extend.values())  # NOTE: prefill rows only; a decode row is 1 token

    @property
    def mixed(self) -> bool:
        """Decode rows rode along (ForwardMode.MIXED)."""
        return bool(self.decoding)


@dataclass
class DecodeRound:
    """A launched decode step of the running batch (`Kit.decode_rounds`): one token per row."""

    index: int  # in Kit.decode_rounds
    rids: list[str]
    cached: dict[str, int]  # rid -> KV entries the step's attention reads (its sequence length)
    mode: str = "decode"

    @property
    def scheduled_tokens(self) -> int:
        return 0  # NOTE: prefill tokens only; a decode step computes one token per row

    @property
    def cached_tokens(self) -> int:
        return sum(self.cached.values())


def record_matches(req) -> list:
    """Record a Req's prefix matches (`init_next_round_input` calls): their `cow_mamba`
    argument, False for the traversal's probe, True/None for the native match."""
    real, calls = req.init_next_round_input, []

    def counting(*a, **k):
        calls.append(k.get("cow_mamba"))
        return real(*a, **k)

    req.init_next_round_input = counting
    return calls


@dataclass(frozen=True)
class ScanTiming:
    """One scan as `Kit.step` ran it: the queue it saw and the process CPU time it took."""

    queued: int  # waiting requests when the scan began
    cpu_s: float  # process CPU time of the scan (checkpoint of a chunk + prefill scan)
    # NOTE: requests the scan loop visited (passed its budget check), for every policy: our
    # runtime counts them; for SGLang's own scan the kit counts its loop's row-limit checks
    # (`_count_visits`), so both scans' host time is modelled on the same regressor.
    visited: int | None = None
    probed: int = 0  # NOTE: visits that ran the traversal's probe match (runtime counts them)
    quiet: bool = False  # the traversal's hooks were off: SGLang's own scan ran


@dataclass
class Kit:
    """SGLang's real scheduler over real pools on CPU, driven round by round."""

    cfg: KitConfig = field(default_factory=KitConfig)
    policy: str = "stock"
    radixflow_config: object | None = None
    geometry: Geometry | None = None
    clock: Callable[[], float] | None = None  # the runtime's clock (default: VirtualClock)
    sleep: Callable[[float], None] | None = None  # what a holding scheduler waits with
    on_complete: Callable[[Req], None] | None = None  # after each request's completion
    on_scan: Callable[[ScanTiming], None] | None = None  # after each scan (step)
    on_retract: Callable[[Req], None] | None = None  # a request retract_decode sent back
    keep_finished: bool = True  # keep completed Reqs in `finished` (a long soak keeps none)
    agreement: Callable | None = None  # how the hold shares rank 0's decision (default: local)
    # "witness": states are exact fingerprints, checked on every forward and a mismatch raises
    # (adapter/witness.py); "scripted": nothing reads a state (the unscripted id is FILLER_ID).
    executor: str = "witness"

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
        if self.clock is None:  # NOTE: virtual time: a hold sleeps to its deadline, not the wall's
            virtual = VirtualClock()
            self.clock, self.sleep = virtual, self.sleep or virtual.sleep
        if self.policy != "stock":  # NOTE: the runtime's collaborators (the twin: virtual time)
            given = {"clock": self.clock, "agreement": self.agreement}
            self.sched.init_radixflow(sleep=self.sleep or (lambda _s: None),
                                      **{k: v for k, v in given.items() if v is not None})
        self.processor = result_processor(self.sched, self.cfg.overlap)
        self.witness = self._witness()
        self.sched._add_request_to_queue = self._requeue_retracted
        self.sched.send_abort_output = lambda _out, req: self._aborted(req)
        self.rounds: list[Round] = []
        self.decode_rounds: list[DecodeRound] = []
        self.finished: dict[str, Req] = {}
        self.retracted: list[str] = []  # rid per retraction, in order
        self.aborted: list[str] = []  # requests retract_decode aborted (nothing left to retract)
        self._outputs: dict[str, tuple[int, ...]] = {}  # scripted generated ids
        self.last_scan: ScanTiming | None = None
        self._kv_total = self.pools.allocator.available_size()
        self._mamba_total = self._mamba_free()
        self._rows_total = self.pools.req_to_token.available_size()
        self._visits = 0  # stock: loop iterations counted by _count_visits
        if self.runtime is None:
            self._count_visits()

    @property
    def runtime(self):
        """The scheduler's RadixFlowRuntime (None for stock)."""
        return getattr(self.sched, "radixflow", None)

    # --- requests ----------------------------------------------------------------------------
    def req(self, rid: str, ids, namespace: str | None = None, max_new_tokens: int = 1,
            output: Sequence[int] = (), ignore_eos: bool = True,
            boundary: int | None = None) -> Req:
        """A Req, after the intake checks SGLang's front end makes before a request can reach
        the scheduler (tokenizer manager: empty input, input longer than the context).
        `output`: the ids it generates (len == max_new_tokens), or () for FILLER_ID each.
        `ignore_eos`: as the client sets it. Either way it runs to max_new_tokens (the kit has
        no EOS id), but admission reserves a running request's whole remaining output only with
        ignore_eos; without, SGLang's new-token ratio (< 1), so retraction can happen."""
        if len(ids) == 0:
            raise ValueError(f"request {rid!r}: input_ids cannot be empty")
        if max_new_tokens < 0:
            raise ValueError(f"request {rid!r}: max_new_tokens {max_new_tokens} (>= 0)")
        if output and len(output) != max_new_tokens:
            raise ValueError(f"request {rid!r}: output has {len(output)} ids, max_new_tokens "
                             f"is {max_new_tokens} (give exactly that many, or none)")
        # NOTE: SGLang's cap (scheduler `max_req_input_len`): min(context, pool) - 1, less 5.
        limit = min(CONTEXT_LEN - 1, self.cfg.kv_tokens - 1) - 5
        if len(ids) > limit:
            raise ValueError(f"request {rid!r}: {len(ids)} input tokens exceed the limit {limit} "
                             f"(context {CONTEXT_LEN}, KV pool {self.cfg.kv_tokens} tokens)")
        # NOTE: a declared boundary travels as the HTTP field does (adapter/boundary.py FIELD)
        custom = None if boundary is None else {"radixflow_boundary": boundary}
        sp = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=ignore_eos,
                            custom_params=custom)
        sp.normalize(None)
        if output:
            self._outputs[rid] = tuple(output)
        return Req(rid, "", array("q", ids), sp, vocab_size=self.sched.model_config.vocab_size,
                   extra_key=namespace)

    def submit(self, *reqs: Req) -> None:
        self.sched.waiting_queue.extend(reqs)

    def abort_waiting(self, rid: str) -> Req:
        """Abort one waiting (possibly parked) request as scheduler.py `abort_request` does for
        each queued request it matches: pop it, the scheduler class's own
        `_release_aborted_request` (ours forgets what RadixFlow knew of it), free its mamba
        slot (the kit has no client to send the abort to). NOTE: upstream matches rids by
        prefix ("r1" would abort "r10" too); the kit aborts exactly `rid`."""
        q = self.sched.waiting_queue
        req = next((r for r in q if r.rid == rid), None)
        if req is None:
            raise KeyError(f"abort_waiting: request {rid!r} is not waiting")
        q.remove(req)
        self.sched._release_aborted_request(req)
        if req.kv.holds_mamba:
            release_kv_cache(req, self.pools.cache, checkpoint=False)
        return req

    def _count_visits(self) -> None:
        """Count SGLang's own scan loop's visits: scheduler.py `_get_new_batch_prefill_raw` calls
        `get_num_allocatable_reqs(..., num_held_rows=...)` once per waiting request past the
        budget check (the kit runs no LoRA, pooling or storage skips before it), the same place
        our runtime counts a visit (scan.py `rf.park`). The other calls pass no num_held_rows."""
        s = self.sched
        real = s.get_num_allocatable_reqs

        def counting(*args, **kwargs):
            if "num_held_rows" in kwargs:
                self._visits += 1
            return real(*args, **kwargs)

        s.get_num_allocatable_reqs = counting

    # --- rounds ------------------------------------------------------------------------------
    def scan(self) -> ScheduleBatch | None:
        """The prefill scan alone (stash the chunk, `get_new_batch_prefill`): no running-batch
        merge, no decode, nothing launched. Tests drive single scans with it; `step` runs the
        event loop's whole `get_next_batch_to_run`."""
        s = self.sched
        if s.chunked_req is not None and s.chunked_req.extend_end > s.chunked_req.prefix_len:
            checkpoint_kv_cache(s.chunked_req, self.pools.cache)  # as get_next_batch_to_run
        with _no_pinned_memory():  # NOTE: a mixed chunk runs prepare_for_decode
            plan = s.get_new_batch_prefill(s.running_batch)  # NOTE: our override holds here
        s.running_batch = plan.running_batch
        return plan.batch_to_run

    def step(self) -> Round | DecodeRound | None:
        """One event-loop iteration: next batch (prefill, else decode), launch, process (the
        previous batch under overlap). Returns the launched round, if any."""
        s = self.sched
        self._settle_outside_step()
        batch = self._timed_next_batch()
        rnd = None
        if batch is not None:
            rnd = self._record(batch) if batch.forward_mode.is_extend() else self._decoded(batch)
            s.result_queue.append((self.launch(batch), None))
        elif not s.result_queue:
            s.new_token_ratio_tracker.reset()  # as Scheduler.on_idle
        if s.result_queue and (not self.cfg.overlap or batch is None
                               or len(s.result_queue) > 1):
            self.complete(s.result_queue.popleft()[0])
        s.last_batch = batch
        return rnd

    def _settle_outside_step(self) -> None:
        """What a test did outside `step` (launched batches, retracted requests), settled as
        the event loop would have before this iteration."""
        s = self.sched
        while self.cfg.overlap and len(s.result_queue) > 1:
            # NOTE: batches a test launched outside `step` (its own scans): the overlap loop
            # has processed every result but the last when it schedules (scheduler.py
            # `_reqs_finishing_inflight` asserts it).
            self.complete(s.result_queue.popleft()[0])
        for b in (s.running_batch, s.last_batch):
            for r in [r for r in (b.reqs if b is not None else ()) if r.is_retracted]:
                # NOTE: retracted outside retract_decode (a test, the harness): it leaves the
                # running batch as retract_decode's filter_batch takes it out.
                self.drop_running(r)

    def _timed_next_batch(self) -> ScheduleBatch | None:
        """`next_batch`, its scan timed and counted (`last_scan`, `on_scan`)."""
        s = self.sched
        queued = len(s.waiting_queue)
        rt, visits = self.runtime, self._visits
        stats = rt.stats if rt is not None else None
        t = time.process_time()
        batch = self.next_batch()
        cpu = time.process_time() - t
        probed, quiet = 0, False
        if rt is None:
            visited = self._visits - visits
        else:  # NOTE: a pass that never reached the scan loop leaves last scan's stats in place
            fresh = rt.stats is not stats
            visited = rt.stats.visited if fresh else 0
            probed = rt.stats.probed if fresh else 0
            quiet = fresh and rt.stats.quiet
        self.last_scan = ScanTiming(queued, cpu, visited, probed, quiet)
        if self.on_scan is not None:
            self.on_scan(self.last_scan)
        return batch

    def next_batch(self) -> ScheduleBatch | None:
        """scheduler.py `get_next_batch_to_run` itself (the running batch is the real one)."""
        s = self.sched
        with _no_pinned_memory():
            plan = s.get_next_batch_to_run(s.running_batch, s.last_batch)
        s.running_batch = plan.running_batch
        return plan.batch_to_run

    def launch(self, batch: ScheduleBatch) -> ScheduleBatch:
        """The forward, at launch (the device runs forwards in launch order): the witness reads
        and writes states now; the result waits for `complete`. Returns what the result queue
        holds: as event_loop_overlap, a copy under overlap (the batch itself may become the
        running batch, which the next step's prepare_for_decode changes)."""
        ids = self.witness.forward(batch, self._scripted) if self.witness is not None else None
        launched = batch.copy() if self.cfg.overlap else batch
        if ids is not None:
            launched._radixflow_ids = ids
        return launched

    def _witness(self):
        if self.executor not in EXECUTORS:
            raise ValueError(f"Kit.executor: {self.executor!r} (choose from "
                             f"{', '.join(EXECUTORS)})")
        if self.executor != "witness":
            return None
        from radixflow_sglang.adapter.witness import Witness

        chunk = getattr(self.sched.model_config.hf_text_config, "mamba_chunk_size", 64)
        return Witness(self.pools.req_to_token, self.pools.allocator.get_kvcache(),
                       self.geometry.vocab_size, chunk)

    def _scripted(self, req: Req, k: int) -> int | None:
        out = self._outputs.get(req.rid, ())
        return out[k] if k < len(out) else None

    def complete(self, batch: ScheduleBatch) -> None:
        """Process one batch's result with SGLang's result processor (scheduler.py
        `process_batch_result`: decode -> `process_batch_result_decode`, extend ->
        `process_batch_result_prefill`), the model's sampled ids being the scripted ones."""
        open_ = [r for r in batch.reqs if not r.finished()]
        result = GenerationBatchResult(next_token_ids=self._sampled(batch))

        try:
            if batch.forward_mode.is_decode():
                self.processor.process_batch_result_decode(batch, result)
            else:
                self.processor.process_batch_result_prefill(batch, result)
        finally:
            # NOTE: a request the result path completed: finished and its KV released (the
            # processor stamps completion after release_kv_cache).
            for req in open_:
                if req.finished() and req.time_stats.completion_time:
                    self._completed(req)
        if self.sched.chunked_req is not None and self.sched.chunked_req.finished():
            self.sched.chunked_req = None

    def _sampled(self, batch: ScheduleBatch) -> torch.Tensor:
        """The ids the model samples for the batch's rows: the witness's (a scripted id where the
        request has one), else each row's next scripted id or FILLER_ID (a row whose output is
        not committed this time gets one too; the processor ignores it). Prefill-only batches
        get zeros, as tp_worker.py does for them."""
        # NOTE: popped: without overlap the launched batch may become the running batch.
        ids = batch.__dict__.pop("_radixflow_ids", None)
        if ids is None and self.witness is not None:  # launched outside `step` / `launch`
            ids = self.witness.forward(batch, self._scripted)
        if batch.is_prefill_only:
            return torch.zeros(len(batch.reqs), dtype=torch.int64)
        if ids is not None:
            return torch.tensor(ids, dtype=torch.int64)
        ids = []
        for r in batch.reqs:
            out = self._outputs.get(r.rid, ())
            n = len(r.output_ids)
            ids.append(out[n] if n < len(out) else FILLER_ID)
        return torch.tensor(ids, dtype=torch.int64)

    def _completed(self, req: Req) -> None:
        if self.keep_finished:
            self.finished[req.rid] = req
        self._outputs.pop(req.rid, None)
        # NOTE: nothing tells the runtime (a server has no completion hook): it must have
        # dropped the request's records itself (the harness's stale_records check)
        if self.on_complete is not None:
            self.on_complete(req)

    def _requeue_retracted(self, req: Req, is_retracted: bool = False) -> None:
        """The scheduler class's own `_add_request_to_queue` (ours forgets what RadixFlow knew
        of a retracted request; upstream's appends it to the waiting queue), then the kit's
        record of the retraction."""
        type(self.sched)._add_request_to_queue(self.sched, req, is_retracted)
        if is_retracted:
            self.retracted.append(req.rid)
            if self.on_retract is not None:
                self.on_retract(req)

    def _aborted(self, req: Req) -> None:
        """retract_decode aborted it (the last request does not fit even alone): it ends."""
        self.aborted.append(req.rid)
        self._completed(req)

    def drop_running(self, req: Req) -> None:
        """Take a request out of the running batch and the not yet merged last batch (what
        `retract_decode`'s filter_batch does for the requests it retracts)."""
        s = self.sched
        for b in (s.running_batch, s.last_batch):
            if b is not None and req in b.reqs:
                b.filter_batch(reqs_to_exclude=[req])

    @property
    def busy(self) -> bool:
        """Requests wait, a chunk continues, a launched batch awaits its result, or requests
        still decode (in the running batch, or in the last batch before its merge)."""
        s = self.sched
        if s.waiting_queue or s.chunked_req is not None or s.result_queue:
            return True
        batches = (s.running_batch, s.last_batch)
        return any(not r.finished() for b in batches if b is not None for r in b.reqs)

    def drain(self, max_rounds: int = 10_000) -> list[Round]:
        """Step until idle; returns the prefill rounds (decode steps: `decode_rounds`)."""
        out = []
        for _ in range(max_rounds):
            if not self.busy:
                return out
            rnd = self.step()
            if rnd is not None and rnd.mode == "prefill":
                out.append(rnd)
        raise RuntimeError(f"not drained after {max_rounds} steps")

    def first_rounds(self) -> dict[str, int]:
        """rid -> index of the prefill round that first selected it."""
        first: dict[str, int] = {}
        for r in self.rounds:
            for rid in r.rids:
                first.setdefault(rid, r.index)
        return first

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
        # NOTE: a mixed batch's decode rows (`decoding_reqs`, appended by mix_with_running)
        # keep req.prefix_len from their last prefill; their row is the batch's: prefix
        # seq_len - 1, extend 1.
        dec = {id(r) for r in batch.decoding_reqs or ()}
        rows = [r for r in batch.reqs if id(r) not in dec]
        decoding = {r.rid: int(batch.prefix_lens[i]) + int(batch.extend_lens[i])
                    for i, r in enumerate(batch.reqs) if id(r) in dec}
        rnd = Round(
            len(self.rounds), [r.rid for r in rows],
            {r.rid: r.extend_end - r.prefix_len for r in rows},
            {r.rid: r.prefix_len for r in rows},
            {r.rid: r.kv.mamba_last_track_seqlen for r in rows}, chunked, decoding=decoding,
        )
        self.rounds.append(rnd)
        return rnd

    def _decoded(self, batch: ScheduleBatch) -> DecodeRound:
        lens = batch.seq_lens_cpu.tolist()
        rnd = DecodeRound(len(self.decode_rounds), [r.rid for r in batch.reqs],
                          {r.rid: int(n) for r, n in zip(batch.reqs, lens, strict=True)})
        self.decode_rounds.append(rnd)
        return rnd

