"""SGLang 0.5.23's real memory pools on CPU, shared by the CPU kit and the simulated worker.

Follows `sglang/test/kits/unified_radix_cache/fixtures.py::build_fixture`. Full-attention KV and
recurrent-state tensors are shrunk (nothing on these paths reads their contents); layer ids,
slot counts and token capacity are the model's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from . import check_sglang_version

check_sglang_version()

from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape  # noqa: E402
from sglang.srt.environ import envs  # noqa: E402
from sglang.srt.mem_cache.allocator import (  # noqa: E402
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from sglang.srt.mem_cache.memory_pool import (  # noqa: E402
    HybridLinearKVPool,
    HybridReqToTokenPool,
    MHATokenToKVPool,
    ReqToTokenPool,
)


def cpu_pools(
    *, rows: int, tokens: int, context: int, num_layers: int, mamba_layers: Sequence[int],
    mamba_slots: int, extra_buffer: bool, page_size: int = 1, **hybrid_kw,
) -> tuple[ReqToTokenPool, object, TokenToKVPoolAllocator]:
    """(req_to_token pool, KV pool, allocator); hybrid when `mamba_layers` is non-empty."""
    if mamba_layers:
        with envs.SGLANG_MAMBA_SSM_DTYPE.override("bfloat16"):
            shape = Mamba2StateShape.create(
                tp_world_size=1, intermediate_size=16, n_groups=1, num_heads=1,
                head_dim=16, state_size=4, conv_kernel=4,
            )
        layers = list(mamba_layers)
        r2t = HybridReqToTokenPool(
            size=rows, mamba_size=mamba_slots, mamba_spec_state_size=rows,
            max_context_len=context, device="cpu", enable_memory_saver=False,
            cache_params=Mamba2CacheParams(shape=shape, layers=layers), mamba_layer_ids=layers,
            enable_mamba_extra_buffer=extra_buffer, **hybrid_kw,
        )
        full = [i for i in range(num_layers) if i not in set(layers)]
        kv = HybridLinearKVPool(
            size=tokens, dtype=torch.bfloat16, page_size=page_size, head_num=1, head_dim=4,
            full_attention_layer_ids=full, device="cpu", enable_memory_saver=False,
            mamba_pool=r2t.mamba_pool,
        )
    else:
        r2t = ReqToTokenPool(size=rows, max_context_len=context, device="cpu",
                             enable_memory_saver=False)
        kv = MHATokenToKVPool(size=tokens, page_size=page_size, dtype=torch.bfloat16,
                              head_num=1, head_dim=4, layer_num=num_layers, device="cpu",
                              enable_memory_saver=False)
    if page_size > 1:  # NOTE: as the model runner picks it for a paged KV cache
        alloc = PagedTokenToKVPoolAllocator(size=tokens, page_size=page_size,
                                            dtype=torch.bfloat16, device="cpu", kvcache=kv,
                                            need_sort=False)
    else:
        alloc = TokenToKVPoolAllocator(size=tokens, dtype=torch.bfloat16, device="cpu",
                                       kvcache=kv, need_sort=False)
    return r2t, kv, alloc
