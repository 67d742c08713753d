"""kvpool's ``KVCacheManager`` for vLLM 0.33: ``vllm.v1.core.kv_cache_manager``.

vLLM's own class, subclassed: every attribute, the coordinator, its
single-type managers and their request tables are vLLM's, so whatever the
scheduler, a connector or a test reads of the manager is there and means
the same. Two methods are compiled (``kvpool._manager``), the ones the
scheduler calls for every running request on every step:

- ``allocate_slots``: in C for a running request's decode or prefill chunk
  (draft and lookahead tokens included), and for a new request with its
  prefix-cache hit and a KV connector's external tokens (asynchronous
  loads' ``delay_cache_blocks`` and the groups whose new blocks are zeroed
  included); vLLM's own method otherwise;
- ``cache_blocks``: vLLM's coordinator only when a group has a block to
  cache (a full-attention group's new full blocks go to the pool directly);
- ``get_computed_blocks``: the prefix-cache lookup of one full-attention
  group, one sliding-window group, or full attention + a sliding window or
  chunked local attention, every block the hash block (EAGLE's dropped
  block and the window's extra one included);
- ``free``, ``estimate_cached_tokens``, ``get_blocks``, ``get_block_ids``,
  ``take_new_block_ids``,
  ``remove_skipped_blocks`` (a window's or an R-SWA group's manager only
  when it frees a block),
  and the coordinator's ``get_num_blocks_to_allocate`` (bound on the
  coordinator instance) when no group has new computed blocks;

and what it hands the scheduler, ``KVCacheBlocks``, is vLLM's class with a
compiled ``get_block_ids`` (the scheduler calls it for every scheduled
request on every step).

Which configurations the compiled paths serve is decided when the manager
is built (``kvpool._manager.plan_for``): groups of full attention, sliding
windows, R-SWA (reference sliding window) and chunked local attention,
prefix caching on or off, with or without EAGLE / MTP / draft tokens, and
cross-attention (encoder-decoder models, which run without prefix caching).
Anything else (Mamba, HiSparse, context parallelism, ...)
runs vLLM's code throughout; ``kvpool_fallback_reason`` says why, and it
is logged once per reason. Imports vLLM.
"""

from __future__ import annotations

import functools
import logging
import types

from vllm.v1.core import kv_cache_coordinator as _coordinator
from vllm.v1.core import kv_cache_manager as _vllm
from vllm.v1.core import single_type_kv_cache_manager as _single
from vllm.v1.request import RequestStatus

from .. import _manager
from . import block_pool as _block_pool

__all__ = ["KVCacheBlocks", "KVCacheManager", "group_lines"]

logger = logging.getLogger("kvpool.vllm")

class KVCacheBlocks(_vllm.KVCacheBlocks):
    """vLLM's ``KVCacheBlocks`` (the same dataclass: fields, equality among
    kvpool's, ``repr``), with ``get_block_ids`` in C."""

    __slots__ = ()
    get_block_ids = _manager.get_block_ids


_COORDINATORS = tuple(
    getattr(_coordinator, name)
    for name in (
        "UnitaryKVCacheCoordinator",
        "HybridKVCacheCoordinator",
        "KVCacheCoordinatorNoPrefixCache",
    )
)

# The group lines already logged (see group_lines), each set once per process.
_logged: set[tuple[str, ...]] = set()


def group_lines(manager) -> list[str]:
    """One line per KV-cache group of ``manager`` (kvpool's, built): its
    spec, the single-type manager class serving it, and whether kvpool's
    compiled paths or vLLM's code run it, and why. Logged at INFO when the
    manager is built (once per process for each set of lines), so a user sees
    at once what kvpool does for their model."""
    plan = manager._kvpool_plan
    reason = manager.kvpool_fallback_reason
    lookup = ""
    if plan is not None and manager.enable_caching and not plan.lookup_compiled:
        lookup = " (its prefix-cache lookup: vLLM's code, for these groups' block sizes or specs)"
    lines = []
    groups = manager.kv_cache_config.kv_cache_groups
    for i, (group, single) in enumerate(zip(groups, manager.coordinator.single_type_managers)):
        layers = len(group.layer_names)
        what = (
            f"kvpool: KV-cache group {i} ({type(group.kv_cache_spec).__name__}, "
            f"{layers} layer{'s' if layers != 1 else ''}) is served by "
            f"{type(single).__name__}"
        )
        if reason is None and getattr(single, "mamba_cache_mode", None) == "align":
            lines.append(f"{what}: kvpool's compiled paths; vLLM's code for a connector's "
                         f"tokens (mamba_cache_mode 'align'){lookup}")
        elif reason is None and getattr(single, "mamba_cache_mode", None) is not None \
                and single.enable_caching:
            # (0.30/0.31's mode "all", or "none" with caching on)
            lines.append(f"{what}: kvpool's compiled paths; vLLM's code for an admission "
                         f"with a prefix-cache hit (mamba_cache_mode "
                         f"{single.mamba_cache_mode!r}){lookup}")
        elif reason is None:
            lines.append(f"{what}: kvpool's compiled paths{lookup}")
        else:
            lines.append(f"{what}: vLLM's code, because kvpool's paths do not serve {reason}")
    return lines


class KVCacheManager(_vllm.KVCacheManager):
    """vLLM's ``KVCacheManager`` with compiled ``allocate_slots`` and
    ``cache_blocks`` (see the module docstring)."""

    #: The vLLM class whose methods take every call outside the fast case.
    _kvpool_base = _vllm.KVCacheManager
    #: 0.33: a group caches no further than the request's hashed tokens.
    _kvpool_cap_at_hashed = True
    #: 0.33: ``free`` gives back a table without its leading null blocks.
    _kvpool_trims_null_head = True
    #: 0.31 on: the coordinator's ``get_num_blocks_to_allocate`` takes ``prefill_end``.
    _kvpool_has_prefill_end = True
    #: 0.31 on: ``allocate_slots`` takes no new tokens if it adopts computed ones.
    _kvpool_zero_chunk_adopts = True
    #: A sliding-window manager's admission cap.
    _kvpool_cap_attr = "max_admission_blocks_per_request"
    #: 0.30, 0.31: the coordinator's get_num_common_prefix_blocks that
    #: kvpool's does in C (0.32 on: the manager answers zeros itself).
    _kvpool_common_prefix_blocks = None
    #: The coordinator's set of groups whose prefix-cache hit drops its last
    #: block for EAGLE / MTP (0.33 on: empty when lookahead hashes prove the
    #: boundary).
    _kvpool_eagle_drop_attr = "drop_eagle_group_ids"
    #: 0.32 on: the hybrid lookup's EAGLE margin reaches at most the hashed
    #: tokens (0.30, 0.31: the lookup's bound).
    _kvpool_eagle_margin_to_hashes = True
    #: 0.32 on: an align-mode Mamba group's partial-tail step reads the block
    #: cdiv(n, block_size) - 1 (0.30, 0.31: n // block_size).
    _kvpool_tail_index_cdiv = True
    #: 0.32 on: a full-attention group's prompt-tail boundary is below
    #: num_prompt_tokens - 1 without EAGLE (0.30, 0.31: num_prompt_tokens).
    _kvpool_tail_eagle_limit = True
    #: An align-mode Mamba group's prefill checkpoint rules (``plan_for``'s
    #: ``align_rules``): 32 from 0.32 on, 31 and 30 for those lines.
    _kvpool_align_rules = 32

    @functools.wraps(_vllm.KVCacheManager.__init__)  # its signature, for callers that read it
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The same empty blocks (nested tuples), of kvpool's class.
        self.empty_kv_cache_blocks = KVCacheBlocks(self.empty_kv_cache_blocks.blocks)
        plan, reason = _manager.plan_for(
            self,
            kv_cache_blocks=KVCacheBlocks,
            request_status=RequestStatus,
            full_cls=_single.FullAttentionManager,
            sliding_cls=_single.SlidingWindowManager,
            rswa_cls=getattr(_single, "RSWAManager", None),
            chunked_cls=getattr(_single, "ChunkedLocalAttentionManager", None),
            cross_cls=getattr(_single, "CrossAttentionManager", None),
            mamba_cls=getattr(_single, "MambaManager", None),
            ring_cls=getattr(_single, "CircularBufferManager", None),
            kpool_tail_cls=getattr(_single, "KpoolTailManager", None),
            base_single=_single.SingleTypeKVCacheManager,
            coordinator_classes=_COORDINATORS,
            unitary_cls=_coordinator.UnitaryKVCacheCoordinator,
            hybrid_cls=_coordinator.HybridKVCacheCoordinator,
            cap_at_hashed=self._kvpool_cap_at_hashed,
            trims_null_head=self._kvpool_trims_null_head,
            has_prefill_end=self._kvpool_has_prefill_end,
            zero_chunk_adopts=self._kvpool_zero_chunk_adopts,
            cap_attr=self._kvpool_cap_attr,
            pool_cache_full_blocks=_block_pool.BlockPoolMixin.cache_full_blocks,
            pool_new_blocks_with_hooks=_block_pool.BlockPoolMixin._get_new_blocks_with_hooks,
            pool_event_extra_keys=_block_pool.BlockPoolMixin._event_extra_keys,
            # (read off the class: on the instance it would be a bound method)
            common_prefix_blocks=type(self)._kvpool_common_prefix_blocks,
            eagle_drop_attr=self._kvpool_eagle_drop_attr,
            eagle_margin_to_hashes=self._kvpool_eagle_margin_to_hashes,
            tail_index_cdiv=self._kvpool_tail_index_cdiv,
            tail_eagle_limit=self._kvpool_tail_eagle_limit,
            align_rules=self._kvpool_align_rules,
        )
        self._kvpool_plan = plan
        #: ``None`` when the compiled paths serve this manager, else why not.
        self.kvpool_fallback_reason = reason
        if plan is not None:
            # The scheduler calls the coordinator's too: the coordinator
            # object stays vLLM's, with this method bound on the instance.
            coordinator = self.coordinator
            coordinator._kvpool_plan = plan
            coordinator.get_num_blocks_to_allocate = types.MethodType(
                _manager.coordinator_get_num_blocks_to_allocate, coordinator
            )
        lines = group_lines(self)
        if tuple(lines) not in _logged:   # (the driver and the tests build many)
            _logged.add(tuple(lines))
            for line in lines:
                logger.info("%s", line)

    allocate_slots = _manager.allocate_slots
    cache_blocks = _manager.cache_blocks
    get_computed_blocks = _manager.get_computed_blocks
    free = _manager.free
    estimate_cached_tokens = _manager.estimate_cached_tokens
    get_blocks = _manager.get_blocks
    get_block_ids = _manager.get_block_ids_of
    take_new_block_ids = _manager.take_new_block_ids
    remove_skipped_blocks = _manager.remove_skipped_blocks

    def new_step_starts(self) -> None:  # noqa: D102 - vLLM's, then the plan's tables rebound
        super().new_step_starts()
        _manager.refresh(self)

    def create_kv_cache_blocks(self, blocks):  # noqa: D102 - vLLM's, of kvpool's class
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks
