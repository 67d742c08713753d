"""kvpool's 0.33 pool for use *inside* vLLM 0.33: it queues vLLM's own event
objects. vLLM's ``KVCacheManager.take_events`` checks
``isinstance(event, BlockStored)`` against vLLM's class and writes the
group's cache-spec fields into it, and the KV-event publisher encodes what it
gets, so inside vLLM the pool must hand out vLLM's structs; kvpool's own are
byte-identical but a different class. Imports vLLM: use only where vLLM 0.33
is installed (``kvpool.vllm`` does)."""

from __future__ import annotations

from types import ModuleType

from .. import CORE
from .block_pool import make_block_pool_class

__all__ = ["vllm_block_pool_class"]

_classes: dict[str, type] = {}


def vllm_block_pool_class(core: ModuleType | None = None) -> type:
    """``kvpool.v0_33.BlockPool`` over ``core`` (default: the core in use)
    whose events are ``vllm.distributed.kv_events``' classes."""
    core = core or CORE
    cls = _classes.get(core.__name__)
    if cls is None:
        from vllm.distributed import kv_events

        base = make_block_pool_class(core)

        class BlockPool(base):  # type: ignore[misc, valid-type]
            __doc__ = base.__doc__
            _BlockStored = kv_events.BlockStored
            _BlockRemoved = kv_events.BlockRemoved
            _AllBlocksCleared = kv_events.AllBlocksCleared

        BlockPool.__module__ = "kvpool.v0_33"
        BlockPool.__qualname__ = "BlockPool"
        cls = _classes[core.__name__] = BlockPool
    return cls
