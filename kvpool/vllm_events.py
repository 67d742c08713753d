"""kvpool's pools for use *inside* vLLM: they queue vLLM's own event objects.

kvpool's event structs encode to the same bytes as vLLM's, but they are other
classes, and code inside vLLM checks the class: vLLM 0.33's
``KVCacheManager.take_events`` writes the group's cache-spec fields into
every ``isinstance(event, BlockStored)``, and vLLM's tests and connectors do
the same checks. So inside vLLM the pool queues vLLM's own structs. Imports
vLLM: use only where vLLM is installed (``kvpool.vllm`` does).
"""

from __future__ import annotations

from types import ModuleType

__all__ = ["vllm_block_pool_class"]

_classes: dict[tuple[str, str], type] = {}


def vllm_block_pool_class(line: str, core: ModuleType | None = None) -> type:
    """The ``BlockPool`` of vLLM API ``line`` ("0.15" for vLLM 0.15/0.16,
    "0.33") over ``core`` (default: the core in use) whose events are
    ``vllm.distributed.kv_events``' classes."""
    from . import CORE

    core = core or CORE
    cls = _classes.get((line, core.__name__))
    if cls is None:
        from vllm.distributed import kv_events

        if line == "0.15":
            from . import BlockPool as default
            from .block_pool import make_block_pool_class
        elif line == "0.33":
            from .v0_33 import BlockPool as default
            from .v0_33.block_pool import make_block_pool_class
        else:
            raise ValueError(f"no kvpool pool for vLLM API line {line!r}")
        # Over the core in use, a subclass of the class the package exports.
        base = default if core is CORE else make_block_pool_class(core)

        class BlockPool(base):  # type: ignore[misc, valid-type]
            __doc__ = base.__doc__
            _BlockStored = kv_events.BlockStored
            _BlockRemoved = kv_events.BlockRemoved
            _AllBlocksCleared = kv_events.AllBlocksCleared

        BlockPool.__module__ = base.__module__
        BlockPool.__qualname__ = "BlockPool"
        cls = _classes[(line, core.__name__)] = BlockPool
    return cls
