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
    """The ``BlockPool`` of vLLM API ``line`` (a name in
    ``kvpool.vllm.VLLM_LINES``: "0.15", "0.33", ...) over ``core`` (default:
    the core in use) whose events are ``vllm.distributed.kv_events``'
    classes. The line's module gives ``BlockPool`` (over the default core)
    and ``make_block_pool_class(core)``; its facade reads its event classes
    from the class attributes ``_BlockStored``, ``_BlockRemoved`` and
    ``_AllBlocksCleared``, which this subclass sets to vLLM's."""
    import importlib

    from . import CORE
    from .vllm import VLLM_LINES

    core = core or CORE
    cls = _classes.get((line, core.__name__))
    if cls is None:
        from vllm.distributed import kv_events

        modules = {entry.name: entry.module for entry in VLLM_LINES}
        if line not in modules:
            raise ValueError(
                f"no kvpool pool for vLLM API line {line!r} (lines: {', '.join(modules)})"
            )
        facade = importlib.import_module(modules[line])
        # Over the core in use, a subclass of the class the package exports.
        base = facade.BlockPool if core is CORE else facade.make_block_pool_class(core)

        class BlockPool(base):  # type: ignore[misc, valid-type]
            __doc__ = base.__doc__
            _BlockStored = kv_events.BlockStored
            _BlockRemoved = kv_events.BlockRemoved
            _AllBlocksCleared = kv_events.AllBlocksCleared

        BlockPool.__module__ = base.__module__
        BlockPool.__qualname__ = "BlockPool"
        cls = _classes[(line, core.__name__)] = BlockPool
    return cls
