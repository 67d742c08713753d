"""kvpool's 0.33 pool for use inside vLLM 0.33 (queues vLLM's own event
objects); see ``kvpool.vllm.events``."""

from __future__ import annotations

from types import ModuleType

from ..vllm.releases import vllm_block_pool_class as _for_line

__all__ = ["vllm_block_pool_class"]


def vllm_block_pool_class(core: ModuleType | None = None) -> type:
    """``kvpool.v0_33.BlockPool`` over ``core`` (default: the core in use)
    whose events are ``vllm.distributed.kv_events``' classes."""
    return _for_line("0.33", core)
