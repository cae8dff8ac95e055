"""SGLang 0.5.23's real server on a CPU box, with a simulated model worker.

Everything but the model is SGLang's own: HTTP server, tokenizer manager, detokenizer, the
scheduler process and its event loop, the radix cache and the memory pools. Only the worker
that `Scheduler.init_tp_model_worker` (managers/scheduler.py) builds is replaced: instead of a
TpModelWorker -> ModelRunner (model load, attention backends, CUDA graphs) the scheduler gets a
`SimulatedWorker` that builds SGLang's real pools on CPU from the model config and, per
forward, emits one deterministic token per request and a cost-model time.

The forward is asynchronous, as a GPU's is: the worker call returns at once, and the loop
waits for the forward where SGLang waits for a GPU's (the result processor's `copy_done`
sync, `_SimDevice`). Host work between the launch and that point (the rest of `run_batch`;
under overlap scheduling the next pass's scan) runs while the forward "runs".

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python -m radixflow_sglang.adapter.simulated \
        --model-path radixflow_sglang/model_dirs/qwen3.5-0.8b --load-format dummy --device cpu \
        --context-length 8192 --host 127.0.0.1 --port 30000 --sleep-on-idle \
        --disable-overlap-schedule --mamba-radix-cache-strategy extra_buffer  # or no_buffer

`--device cpu` lets server-arg resolution and the gloo process groups run without CUDA (do not
set SGLANG_USE_CPU_ENGINE). Overlap scheduling (omit --disable-overlap-schedule) also runs.
RADIXFLOW_POLICY selects the scheduler class; RADIXFLOW_SIM_PROFILE (box, paper) the cost model,
RADIXFLOW_SIM_ALPHA/BETA/GAMMA override its coefficients (radixflow_sglang/profiles.py);
RADIXFLOW_SIM_GATE (tests only) lets a test hold each forward (adapter/forward_gate.py);
RADIXFLOW_SIM_SCAN_TAX_US (--radixflow-sim-scan-tax-us) spends that much more scheduler CPU
before each prefill scan with work queued, under every policy (`scan_tax`, a what-if).

`run_scheduler_process_simulated` is handed to `http_server.launch_server` as its
`run_scheduler_process_func`; the scheduler child is spawned, so its patches happen there.
"""

from __future__ import annotations

import logging
import os
import time
from types import SimpleNamespace

from radixflow_sglang import profiles
from radixflow_sglang.config import config_from_env

from . import check_sglang_version, sim_outputs
from .forward_timer import READY_ATTR, SIM_ATTR, SPAN_ATTR
from .pools import cpu_pools
from .witness import Witness, witness_metrics

check_sglang_version()

import sglang.srt.managers.scheduler as _sched_mod  # noqa: E402
import torch  # noqa: E402
from sglang.srt.configs.hybrid_arch import mambaish_config  # noqa: E402
from sglang.srt.configs.model_config import ModelConfig  # noqa: E402
from sglang.srt.managers.scheduler_components.batch_result_processor import (  # noqa: E402
    SchedulerBatchResultProcessor as _PROCESSOR,
)
from sglang.srt.managers.tp_worker import TpModelWorker  # noqa: E402
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402
from sglang.srt.model_executor.model_runner_components.ngram_embedding_manager import (  # noqa: E402
    NgramEmbeddingManager,
)
from sglang.srt.runtime_context import get_device, get_exec, get_parallel, get_schedule  # noqa: E402

logger = logging.getLogger(__name__)
_UPSTREAM_SCHEDULER = _sched_mod.Scheduler
_UPSTREAM_RUN = _sched_mod.run_scheduler_process
_scan_tax_us = 0.0  # the scheduler child's --radixflow-sim-scan-tax-us (PATCH 6), for /server_info


class CostModel:
    """c = alpha + beta * tokens + gamma * rows seconds: the profile RADIXFLOW_SIM_PROFILE names
    (box or paper, radixflow_sglang/profiles.py) for the served model, each of
    RADIXFLOW_SIM_ALPHA/BETA/GAMMA overriding its coefficient."""

    def __init__(self, model_path: str | None = None) -> None:
        self.sim = profiles.resolve(os.environ.get(profiles.PROFILE_VAR),
                                    profiles.model_of(model_path), os.environ)
        self.alpha, self.beta, self.gamma = self.sim.alpha, self.sim.beta, self.sim.gamma

    def __call__(self, tokens: int, rows: int) -> float:
        return self.alpha + self.beta * tokens + self.gamma * rows


def run_scheduler_process_simulated(*args, **kwargs):
    """SGLang's `run_scheduler_process` (managers/scheduler.py) with the simulated worker.

    Runs in the spawned scheduler child, before upstream builds `Scheduler(...)` (a module-global
    lookup): RADIXFLOW_POLICY unset or "stock" keeps SGLang's class, any other value selects
    RadixFlowScheduler, configured from the RADIXFLOW_* environment (config_from_env)."""
    from .entry import install

    install(os.environ.get("RADIXFLOW_POLICY") or "stock")
    # PATCH 1: managers/scheduler.py Scheduler.init_tp_model_worker builds TpModelWorker ->
    # ModelRunner (needs CUDA); build the simulated worker instead. Patched on the upstream
    # class so our subclass inherits it.
    _UPSTREAM_SCHEDULER.init_tp_model_worker = _init_tp_model_worker
    # PATCH 3: managers/schedule_batch.py ScheduleBatch.prepare_for_decode stages the extra_buffer
    # track mask with `.pin_memory()`, which a CUDA torch build refuses without a driver. Page
    # locking only speeds host-to-device copies, and here the "device" is the host.
    if not torch.cuda.is_available():
        torch.Tensor.pin_memory = lambda self, *a, **k: self
    # PATCH 4: managers/scheduler.py Scheduler.get_internal_state: /server_info carries the
    # witness executor's counts (internal_states[i].witness), the cost profile in force
    # (.sim_cost), the forwards' token counts (.simulated) and SGLang's idle leak check,
    # answered (.pools), under every policy.
    _UPSTREAM_SCHEDULER.get_internal_state = _with_witness(_UPSTREAM_SCHEDULER.get_internal_state)
    wait_where_sglang_syncs()
    # PATCH 6: managers/scheduler.py Scheduler.get_new_batch_prefill spends the what-if's host
    # time first (--radixflow-sim-scan-tax-us; RadixFlowScheduler's override calls it too)
    global _scan_tax_us
    tax_us = _scan_tax_us = config_from_env().sim_scan_tax_us
    if tax_us > 0:  # NOTE: logged with the worker (SGLang configures the child's logging)
        _UPSTREAM_SCHEDULER.get_new_batch_prefill = scan_tax(
            _UPSTREAM_SCHEDULER.get_new_batch_prefill, tax_us * 1e-6)
    return _UPSTREAM_RUN(*args, **kwargs)


def scan_tax(upstream, seconds: float, cpu=time.thread_time):
    """`upstream` (a scheduler's get_new_batch_prefill) after spinning until the calling
    thread has spent `seconds` more CPU (`cpu`: its clock) when the waiting queue holds work:
    host time as a scan's own work costs it, CPU that another process on the box may hold up
    (on a busy 2-core box a wall-clock wait would cost less than the same work)."""

    def get_new_batch_prefill(self, *args, **kwargs):
        if self.waiting_queue:
            end = cpu() + seconds
            while cpu() < end:
                pass
        return upstream(self, *args, **kwargs)

    get_new_batch_prefill.__wrapped__ = upstream
    return get_new_batch_prefill


SYNCED = ("process_batch_result_prefill", "process_batch_result_decode",
          "process_batch_result_idle")


def wait_where_sglang_syncs() -> None:
    """PATCH 5: scheduler_components/batch_result_processor.py process_batch_result_{prefill,
    decode,idle} begin with `result.copy_done.synchronize()` (overlap) or read the GPU's
    tokens (`.tolist()`): where a GPU server's loop first waits for the forward. The simulated
    forward's time is waited for there (`wait_ready`), under every policy. Idempotent."""
    for name in SYNCED:
        upstream = getattr(_PROCESSOR, name)
        if not getattr(upstream, "_radixflow_waits", False):
            setattr(_PROCESSOR, name, _after_forward(upstream))


def _after_forward(upstream):
    def process(self, batch, result, *args, **kwargs):
        wait_ready(result)
        return upstream(self, batch, result, *args, **kwargs)

    process._radixflow_waits = True
    process.__wrapped__ = upstream
    return process


def wait_ready(result, clock=time.perf_counter, sleep=time.sleep) -> float:
    """Sleep until a simulated forward's result is ready (`READY_ATTR`, the clock's reading);
    the seconds slept (0 for a result that is ready or is no simulated forward's)."""
    ready = getattr(result, READY_ATTR, None)
    left = 0.0 if ready is None else ready - clock()
    if left > 0:
        sleep(left)
    return max(left, 0.0)


class _SimDevice:
    """The one device the simulated forwards run on, in launch order (a GPU stream's): a
    forward starts when it is launched or when the one before it ends, whichever is later,
    and takes its cost-model time. Pure: the caller passes the clock's readings."""

    def __init__(self) -> None:
        self.free_at = float("-inf")

    def launch(self, now: float, cost: float) -> float:
        """The time a forward launched at `now` is ready."""
        self.free_at = max(now, self.free_at) + cost
        return self.free_at


def _with_witness(upstream):
    def get_internal_state(self, recv_req):
        out = upstream(self, recv_req)
        witness = getattr(self.tp_worker, "witness", None)
        if witness is not None:
            out.internal_state["witness"] = witness.stats.as_dict()
        cost = getattr(self.tp_worker, "cost", None)
        if isinstance(cost, CostModel):
            out.internal_state["sim_cost"] = cost.sim.as_dict()
        out.internal_state["sim_scan_tax_us"] = _scan_tax_us  # NOTE: 0: no what-if in force
        out.internal_state["simulated"] = dict(self.tp_worker.counts)
        out.internal_state["pools"] = pool_check(self)
        return out

    return get_internal_state


def pool_check(sched) -> dict:
    """SGLang's idle leak check, answered instead of raised: managers/scheduler.py `on_idle`
    runs `_check_all_pools` and `_check_req_pool` (invariant_checker.py) once the loop is fully
    idle; here the same checks, run when asked and the scheduler `is_fully_idle` (otherwise
    running requests own slots and nothing is checked: idle False)."""
    if not sched.is_fully_idle():
        return {"idle": False, "leak": None, "messages": []}
    if sched.enable_hisparse:  # NOTE: on_idle skips it too (its counters diverge by design)
        return {"idle": True, "leak": None, "messages": ["not checked: hisparse"]}
    checker = sched.invariant_checker
    leak, messages = checker._check_all_pools(sched.pool_stats_observer.get_pool_stats())
    pool = sched.req_to_token_pool
    held = sched.pool_stats_observer.session_held_req_count()
    free, total = len(pool.free_slots) + held, pool.size + pool.pre_alloc_size
    if free != total:
        leak = True
        messages = [*messages, f"req_to_token_pool: {free} of {total} slots free"]
    return {"idle": True, "leak": bool(leak), "messages": messages if leak else []}


def _init_tp_model_worker(self) -> None:
    self.tp_worker = SimulatedWorker(self.server_args)
    tax = (f"; what-if: {_scan_tax_us:g} us of scheduler CPU before each prefill scan with "
           "work queued" if _scan_tax_us else "")
    logger.info("radixflow: simulated model worker, scheduler class %s, %s%s",
                type(self).__name__, self.tp_worker.cost.sim.describe(), tax)
    if os.environ.get("RADIXFLOW_SIM_GATE"):  # NOTE: test hook, adapter/forward_gate.py
        from .forward_gate import ForwardGate

        self.tp_worker.gate = ForwardGate.from_env(self)


class _SimRunner:
    """What the scheduler and TpModelWorker read off `model_runner` (model_runner.py ModelRunner):
    plain values, upstream's disabled managers, and no-op init steps (no model, no backends)."""

    def __init__(self, model_config) -> None:
        self.model_config = model_config
        self.device = "cpu"
        self.forward_stream = torch.cpu.Stream()
        self.model = None  # get_pad_input_ids_func: no pad_input_ids
        self.memory_pool_config = None
        self.req_to_token_pool = None
        self.token_to_kv_pool = None
        self.token_to_kv_pool_allocator = None
        self.canary_manager = None
        self.sliding_window_size = None
        self.is_hybrid_swa = False
        self.mtp_draft_device_pools = ()
        self.mtp_draft_mamba_pools = ()
        self.graph_memory_usage = {}
        self.graph_time_usage = {}
        self.weight_load_time = 0.0
        self.preloaded_weights_bytes = 0
        self.weight_load_mem_usage = 0.0
        # Read by Scheduler.init_overlap (decide_needs_cpu_seq_lens) and the prefill scan.
        self.attn_backend = SimpleNamespace(needs_cpu_seq_lens=True)
        self.prefill_aware_swa = False
        # Upstream's own manager, disabled (ModelRunner.init_ngram_embedding_manager).
        self.ngram_embedding_manager = NgramEmbeddingManager(enabled=False, table=None, n=0)
        self.lora_manager = None
        self.eplb_manager = None
        self.hisparse_coordinator = None
        self.device_timer = None
        self.shared_read_done_event = None

    def alloc_memory_pool(self, memory_pool_config=None, **_kw) -> None:
        build_pools(self)

    def account_preloaded_weights(self, _bytes: int) -> None:
        pass

    def init_attention_backends(self) -> None:
        pass

    def init_cuda_graphs(self, capture_decode_cuda_graph: bool = True) -> None:
        pass

    def prewarm_sampling(self) -> None:
        pass


class SimulatedWorker(TpModelWorker):
    """managers/tp_worker.py TpModelWorker without its ModelRunner: upstream's methods (worker
    info, pool hand-out, init steps) run over `_SimRunner`; the forward is simulated."""

    def __init__(self, server_args) -> None:  # NOTE: replaces TpModelWorker.__init__ entirely
        self.server_args = server_args
        self.is_draft_worker = False
        self.is_multi_layer_eagle = False
        self.req_to_token_pool = self.token_to_kv_pool_allocator = None
        self.model_runner_list = []
        self.model_config = ModelConfig.from_server_args(server_args)
        self._model_runner = _SimRunner(self.model_config)
        self.dllm_algorithm = None
        self.tokenizer = self.processor = None
        self.device = "cpu"
        self.pp_group = get_parallel().pp_group
        self.world_group = get_parallel().world_group
        self.random_seed = get_device().random_seed
        self.enable_overlap = not get_schedule().disable_overlap_schedule
        self.enable_spec = False
        self.hicache_layer_transfer_counter = None
        self.cost = CostModel(server_args.model_path)
        self.device_queue = _SimDevice()
        self.vocab = self.model_config.vocab_size
        self.witness: Witness | None = None  # built on the first forward (the pools exist then)
        # NOTE: what the forwards computed (internal_states[i].simulated): prefill tokens are
        # every extend's new tokens, SGLang's n > 1 warm-up prefills included
        self.counts = {"prefill_tokens": 0, "prefill_forwards": 0, "decode_forwards": 0}

    def _make_witness(self) -> Witness:
        mr = self._model_runner
        chunk = getattr(self.model_config.hf_text_config, "mamba_chunk_size", 64)
        # NOTE: not strict: a served mismatch is counted, logged and shown in /server_info
        metrics = witness_metrics(self.server_args.enable_metrics)
        self.witness = Witness(mr.req_to_token_pool, mr.token_to_kv_pool, self.vocab, chunk,
                               strict=False, metrics=metrics)
        return self.witness

    # --- the forward -------------------------------------------------------------------
    gate = None  # a testing.gate.ForwardGate when RADIXFLOW_SIM_GATE is set

    def forward_batch_generation(self, batch, forward_batch=None, **_kw):
        t0 = time.perf_counter()  # NOTE: the launch: a gate's hold below is the forward's time
        if self.gate is not None:
            self.gate.hold(batch)
        start = time.perf_counter()
        reqs = batch.reqs
        tokens = int(batch.extend_num_tokens) if batch.forward_mode.is_extend() else len(reqs)
        self._count(batch.forward_mode.is_extend(), tokens)
        # NOTE: the witness runs the deferred clear / copy-on-write, checks every state it is
        # handed against its prefix and picks a token from the state it computed (witness.py)
        witness = self.witness or self._make_witness()
        ids = witness.forward(batch)
        result = GenerationBatchResult(
            next_token_ids=torch.tensor(ids, dtype=torch.int64), can_run_cuda_graph=False
        )
        result._radixflow_witness_ids = ids
        sim_outputs.attach(result, batch, self.vocab, self.enable_overlap,  # logprobs, grammar
                           on_final=lambda final: witness.amend(batch, ids, final))
        witness.publish_metrics()
        cost = self.cost(tokens, len(reqs))
        # NOTE: the witness's own CPU time is inside the forward's (it starts at `start`)
        ready = self.device_queue.launch(start, cost)
        setattr(result, SIM_ATTR, cost)  # NOTE: the forward's duration, for the round-cost fit
        setattr(result, READY_ATTR, ready)  # NOTE: waited for where SGLang syncs (PATCH 5)
        setattr(result, SPAN_ATTR, ready - t0)  # NOTE: launch to ready, the loop's forward
        return result

    def _count(self, extend: bool, tokens: int) -> None:
        if extend:
            self.counts["prefill_tokens"] += tokens
            self.counts["prefill_forwards"] += 1
        else:
            self.counts["decode_forwards"] += 1


def build_pools(mr: _SimRunner) -> None:
    """SGLang's real pools on CPU (as kit.build_pools), sized from the server args.

    Full-attention KV and recurrent state tensors are shrunk (nothing reads their contents);
    layer ids, slot counts and token capacity are the model's / the server's."""
    mc = mr.model_config
    sched = get_schedule()
    rows = sched.max_running_requests or 64
    tokens = sched.max_total_tokens or 200_000
    ctx = mc.context_len + 8
    n_layers = mc.num_hidden_layers
    ssm = mambaish_config(mc)
    layers = list(ssm.mamba2_cache_params.layers) if ssm is not None else []
    mamba = get_exec().mamba
    hybrid_kw = {} if ssm is None else {
        "enable_mamba_extra_buffer_lazy": mamba.enable_mamba_extra_buffer_lazy,
        "enable_overlap_schedule": not sched.disable_overlap_schedule,
    }
    r2t, kv, alloc = cpu_pools(
        rows=rows, tokens=tokens, context=ctx, num_layers=n_layers, mamba_layers=layers,
        mamba_slots=sched.max_mamba_cache_size or rows * 4 + 64,
        extra_buffer=ssm is not None and mamba.enable_mamba_extra_buffer,
        page_size=sched.page_size, **hybrid_kw,
    )
    mr.req_to_token_pool = r2t
    mr.token_to_kv_pool = kv
    mr.token_to_kv_pool_allocator = alloc
    # What TpModelWorker.get_worker_info / alloc_memory_pool read back.
    mr.max_running_requests = rows
    mr.logical_max_total_num_tokens = mr.effective_logical_max_total_num_tokens = tokens


def allow_extra_buffer_on_cpu() -> None:
    """PATCH 2: arg_groups/mamba_hook.py _platform_supports_mamba_cache_extra_buffer is False on
    CPU, so server-arg resolution rejects extra_buffer; the pool's state snapshots it gates are
    plain tensor copies, which CPU tensors do. Needed in the process that resolves the args."""
    import sglang.srt.arg_groups.mamba_hook as mamba_hook

    mamba_hook._platform_supports_mamba_cache_extra_buffer = lambda: True


def launch_simulated_server(argv: list[str]) -> None:
    """`python -m sglang.launch_server`'s HTTP path with the simulated scheduler process."""
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args

    from .validate import install as install_checks

    allow_extra_buffer_on_cpu()
    install_checks("simulated")  # NOTE: 400 for what this executor cannot produce
    launch_server(prepare_server_args(argv),
                  run_scheduler_process_func=run_scheduler_process_simulated)


if __name__ == "__main__":
    import sys

    # NOTE: import by package name so spawn pickles a function of an importable module.
    from radixflow_sglang.adapter.simulated import launch_simulated_server as _launch

    _launch(sys.argv[1:])
