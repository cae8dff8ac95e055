"""SGLang 0.5.23's real server on a CPU box, with a simulated model worker.

Everything but the model is SGLang's own: HTTP server, tokenizer manager, detokenizer, the
scheduler process and its event loop, the radix cache and the memory pools. Only the worker
that `Scheduler.init_tp_model_worker` (managers/scheduler.py) builds is replaced: instead of a
TpModelWorker -> ModelRunner (model load, attention backends, CUDA graphs) the scheduler gets a
`SimulatedWorker` that builds SGLang's real pools on CPU from the model config and, per
forward, sleeps a cost-model time and emits one deterministic token per request.

    launch_simulated_server(["--model-path", "launch/models/qwen3.5-0.8b", ...])

`run_scheduler_process_simulated` is handed to `http_server.launch_server` as its
`run_scheduler_process_func`; the scheduler child is spawned, so all patches happen there.
"""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

from . import check_sglang_version

check_sglang_version()

import sglang.srt.managers.scheduler as _sched_mod  # noqa: E402
import torch  # noqa: E402
from sglang.srt.configs.hybrid_arch import mambaish_config  # noqa: E402
from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape  # noqa: E402
from sglang.srt.environ import envs  # noqa: E402
from sglang.srt.managers.tp_worker import BaseTpWorker  # noqa: E402
from sglang.srt.managers.utils import GenerationBatchResult  # noqa: E402
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.memory_pool import (  # noqa: E402
    HybridLinearKVPool,
    HybridReqToTokenPool,
    MHATokenToKVPool,
    ReqToTokenPool,
)
from sglang.srt.runtime_context import get_device, get_exec, get_schedule  # noqa: E402

_UPSTREAM_SCHEDULER = _sched_mod.Scheduler
_UPSTREAM_RUN = _sched_mod.run_scheduler_process


def _env_float(name: str, default: float) -> float:
    v = os.environ.get(name)
    return float(v) if v else default


class CostModel:
    """c = alpha + beta * tokens + gamma * rows seconds (env RADIXFLOW_SIM_ALPHA/BETA/GAMMA)."""

    def __init__(self) -> None:
        self.alpha = _env_float("RADIXFLOW_SIM_ALPHA", 0.005)
        self.beta = _env_float("RADIXFLOW_SIM_BETA", 2e-6)
        self.gamma = _env_float("RADIXFLOW_SIM_GAMMA", 1e-4)

    def __call__(self, tokens: int, rows: int) -> float:
        return self.alpha + self.beta * tokens + self.gamma * rows


def run_scheduler_process_simulated(*args, **kwargs):
    """SGLang's `run_scheduler_process` (managers/scheduler.py) with the simulated worker."""
    policy = os.environ.get("RADIXFLOW_POLICY")
    if policy and policy != "stock":
        from .scheduler import RadixFlowScheduler

        _sched_mod.Scheduler = RadixFlowScheduler
    # PATCH 1: managers/scheduler.py Scheduler.init_tp_model_worker builds TpModelWorker ->
    # ModelRunner (needs CUDA); build the simulated worker instead. Patched on the upstream
    # class so our subclass inherits it.
    _UPSTREAM_SCHEDULER.init_tp_model_worker = _init_tp_model_worker
    return _UPSTREAM_RUN(*args, **kwargs)


def _init_tp_model_worker(self) -> None:
    self.tp_worker = SimulatedWorker(self.server_args)


class _SimRunner:
    """What the scheduler reads off `tp_worker.model_runner` (model_executor/model_runner.py)."""

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
        self.ngram_embedding_manager = None
        self.lora_manager = None
        self.eplb_manager = None
        self.hisparse_coordinator = None
        self.device_timer = None
        self.shared_read_done_event = None

    def account_preloaded_weights(self, _bytes: int) -> None:
        pass

    def prewarm_sampling(self) -> None:
        pass


class SimulatedWorker(BaseTpWorker):
    """Stands in for managers/tp_worker.py TpModelWorker: real pools, simulated forward."""

    def __init__(self, server_args) -> None:
        from sglang.srt.configs.model_config import ModelConfig

        self.server_args = server_args
        self.model_config = ModelConfig.from_server_args(server_args)
        self._model_runner = _SimRunner(self.model_config)
        self.model_runner_list = []
        self.device = "cpu"
        self.random_seed = get_device().random_seed
        self.cost = CostModel()
        self.vocab = self.model_config.vocab_size
        self.dllm_algorithm = None

    @property
    def model_runner(self):
        return self._model_runner

    # --- init-time questions -------------------------------------------------------------
    def alloc_memory_pool(self, *args, **kwargs) -> None:
        build_pools(self._model_runner)

    def init_attention_backends(self) -> None:
        pass

    def init_cuda_graphs(self, capture_decode_cuda_graph: bool = True) -> None:
        pass

    def get_worker_info(self):
        mr = self._model_runner
        max_req_len = min(self.model_config.context_len - 1, mr.max_total_num_tokens - 1)
        return (
            mr.max_total_num_tokens,
            get_schedule().max_prefill_tokens,
            mr.max_running_requests,
            get_schedule().max_queued_requests,
            max_req_len,
            max_req_len - 5,
            self.random_seed,
            self.device,
            mr.forward_stream,
            mr.req_to_token_pool.size,
            mr.req_to_token_pool.max_context_len,
            mr.token_to_kv_pool.size,
        )

    # --- the forward -------------------------------------------------------------------
    def forward_batch_generation(self, batch, forward_batch=None, **_kw):
        t0 = time.perf_counter()
        reqs = batch.reqs
        if batch.forward_mode.is_extend():
            _run_deferred_mamba_cow(self._model_runner.req_to_token_pool, batch)
            tokens = int(batch.extend_num_tokens)
        else:
            tokens = len(reqs)
        ids = [(sum(r.origin_input_ids) + sum(r.output_ids)) % self.vocab for r in reqs]
        result = GenerationBatchResult(
            next_token_ids=torch.tensor(ids, dtype=torch.int64), can_run_cuda_graph=False
        )
        left = self.cost(tokens, len(reqs)) - (time.perf_counter() - t0)
        if left > 0:
            time.sleep(left)
        return result


def _run_deferred_mamba_cow(pool, batch) -> None:
    """model_runner.py ModelRunner._maybe_execute_deferred_mamba_cow_and_clear, on CPU."""
    if not isinstance(pool, HybridReqToTokenPool):
        return
    if batch.mamba_clear_indices is not None and len(batch.mamba_clear_indices):
        pool.mamba_pool.clear_slots(pool.translate_mamba_indices(batch.mamba_clear_indices))
    if batch.mamba_cow_src_indices is not None and len(batch.mamba_cow_src_indices):
        pool.copy_mamba_state(pool.translate_mamba_indices(batch.mamba_cow_src_indices),
                              pool.translate_mamba_indices(batch.mamba_cow_dst_indices))


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
    if ssm is not None:
        layers = list(ssm.mamba2_cache_params.layers)
        with envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
            shape = Mamba2StateShape.create(
                tp_world_size=1, intermediate_size=16, n_groups=1, num_heads=1,
                head_dim=16, state_size=4, conv_kernel=4,
            )
        mamba = get_exec().mamba
        r2t = HybridReqToTokenPool(
            size=rows, mamba_size=sched.max_mamba_cache_size or rows * 4 + 64,
            mamba_spec_state_size=rows, max_context_len=ctx, device="cpu",
            enable_memory_saver=False,
            cache_params=Mamba2CacheParams(shape=shape, layers=layers),
            mamba_layer_ids=layers,
            enable_mamba_extra_buffer=mamba.enable_mamba_extra_buffer,
            enable_mamba_extra_buffer_lazy=mamba.enable_mamba_extra_buffer_lazy,
            enable_overlap_schedule=not sched.disable_overlap_schedule,
        )
        kv = HybridLinearKVPool(
            size=tokens, dtype=torch.bfloat16, page_size=sched.page_size, head_num=1,
            head_dim=4, full_attention_layer_ids=[i for i in range(n_layers)
                                                  if i not in set(layers)],
            device="cpu", enable_memory_saver=False, mamba_pool=r2t.mamba_pool,
        )
    else:
        r2t = ReqToTokenPool(size=rows, max_context_len=ctx, device="cpu",
                             enable_memory_saver=False)
        kv = MHATokenToKVPool(size=tokens, page_size=sched.page_size, dtype=torch.bfloat16,
                              head_num=1, head_dim=4, layer_num=n_layers, device="cpu",
                              enable_memory_saver=False)
    mr.req_to_token_pool = r2t
    mr.token_to_kv_pool = kv
    mr.token_to_kv_pool_allocator = TokenToKVPoolAllocator(
        size=tokens, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False)
    mr.max_total_num_tokens = tokens
    mr.max_running_requests = rows


def launch_simulated_server(argv: list[str]) -> None:
    """`python -m sglang.launch_server`'s HTTP path with the simulated scheduler process."""
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args

    launch_server(prepare_server_args(argv),
                  run_scheduler_process_func=run_scheduler_process_simulated)


if __name__ == "__main__":
    import sys

    launch_simulated_server(sys.argv[1:])
