"""kvpool's pools for use *inside* vLLM: they queue vLLM's own event objects.

kvpool's event structs encode to the same bytes as vLLM's, but they are other
classes, and code inside vLLM checks the class: vLLM 0.33's
``KVCacheManager.take_events`` writes the group's cache-spec fields into
every ``isinstance(event, BlockStored)``, and vLLM's tests and connectors do
the same checks. So inside vLLM the pool queues vLLM's own structs.
Imports vLLM when called: use only where vLLM is installed. Knows no
release: ``kvpool.vllm.releases`` says which pool each line has.
"""

from __future__ import annotations

__all__ = ["with_vllm_events"]


def with_vllm_events(base: type) -> type:
    """A new subclass of the kvpool pool class ``base`` whose events are
    ``vllm.distributed.kv_events``' classes (``VLLMLine.block_pool`` makes
    one per line and core, and keeps it). A line's facade reads its event
    classes from the class attributes ``_BlockStored``, ``_BlockRemoved``
    and ``_AllBlocksCleared``, which the subclass sets to vLLM's; it keeps
    ``base``'s name, module and doc."""
    from vllm.distributed import kv_events

    class BlockPool(base):  # type: ignore[misc, valid-type]
        __doc__ = base.__doc__
        _BlockStored = kv_events.BlockStored
        _BlockRemoved = kv_events.BlockRemoved
        _AllBlocksCleared = kv_events.AllBlocksCleared

    BlockPool.__module__ = base.__module__
    BlockPool.__qualname__ = "BlockPool"
    return BlockPool
