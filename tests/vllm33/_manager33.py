"""A small kvpool 0.33 KV-cache manager and its requests, for the tests
that call the manager directly (bad input, the plan's tables)."""

from __future__ import annotations

import vllm_workload33 as vw
from _vllm_helpers import pool_in_vllm

from kvpool.v0_33.kv_cache_manager import KVCacheManager
from kvpool.vllm import vllm_block_pool_class

BLOCK = 16


def kvpool_manager(caching: bool = True):
    """``(workload, manager)``: kvpool's manager over kvpool's 0.33 pool,
    64 blocks of 16 tokens, in the compiled paths' scope."""
    w = vw.FULL.scaled(num_requests=4, num_blocks=64, enable_caching=caching)
    with pool_in_vllm(vllm_block_pool_class("0.33")):
        mgr = vw.make_manager(w, KVCacheManager)
    assert mgr.kvpool_fallback_reason is None
    return w, mgr


def new_request(w, rid: str, num_tokens: int):
    """A request of ``num_tokens`` prompt tokens (1, 2, ...), hashed as the
    workload's scheduler would."""
    return vw.new_request(rid, list(range(1, num_tokens + 1)), 4, vw.request_block_hasher(w))
