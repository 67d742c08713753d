"""A pytest plugin that runs vLLM's own tests with kvpool's classes in place
of vLLM's: ``pytest -p kvpool_swap <vLLM's test files>`` (with this directory
on ``sys.path``). ``KVPOOL_SWAP=0`` runs them stock, for the comparison.

Before any test module is imported, every ``vllm.*`` module that binds
``BlockPool``, ``BlockHashToBlockMap``, ``KVCacheBlock`` or
``FreeKVCacheBlockQueue`` to vLLM's own class gets kvpool's of the matching
API line instead (``kvpool`` for vLLM 0.15/0.16, ``kvpool.v0_33`` for 0.33),
so the tests' ``from vllm.v1.core.block_pool import BlockPool`` and vLLM's own
managers both see kvpool. Events stay vLLM's classes (the 0.33 line queues
vLLM's own objects; the 0.15 line's structs encode identically). The core is
the compiled one unless ``KVPOOL_NO_EXTENSIONS=1``.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest

NAMES = ("BlockPool", "BlockHashToBlockMap", "KVCacheBlock", "FreeKVCacheBlockQueue")
# Every module of vLLM that binds one of NAMES at import (checked below:
# a module binding one of vLLM's originals after the swap is an error).
MODULES = (
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.block_pool",
    "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.v1.core.kv_cache_manager",
    "vllm.v1.core.sched.scheduler",
)


def _kvpool_classes() -> dict[str, type]:
    import vllm

    from kvpool.vllm_events import vllm_block_pool_class

    line = {"0.15": "0.15", "0.16": "0.15", "0.33": "0.33"}.get(
        ".".join(vllm.__version__.split(".")[:2])
    )
    if line is None:
        raise pytest.UsageError(f"kvpool_swap: no kvpool line for vLLM {vllm.__version__}")
    if line == "0.15":
        import kvpool as k
    else:
        import kvpool.v0_33 as k
    return {"BlockPool": vllm_block_pool_class(line), "BlockHashToBlockMap": k.BlockHashToBlockMap,
            "KVCacheBlock": k.KVCacheBlock, "FreeKVCacheBlockQueue": k.FreeKVCacheBlockQueue}


def swap() -> list[str]:
    """Put kvpool's classes in place of vLLM's; the rebound names."""
    originals: dict[str, object] = {}
    for mod in MODULES:
        try:
            importlib.import_module(mod)
        except ImportError:
            continue
    utils = sys.modules["vllm.v1.core.kv_cache_utils"]
    bp = sys.modules["vllm.v1.core.block_pool"]
    originals = {
        "BlockPool": bp.BlockPool,
        "BlockHashToBlockMap": bp.BlockHashToBlockMap,
        "KVCacheBlock": utils.KVCacheBlock,
        "FreeKVCacheBlockQueue": utils.FreeKVCacheBlockQueue,
    }
    ours = _kvpool_classes()
    rebound = []
    for name, module in list(sys.modules.items()):
        if not name.startswith("vllm") or module is None:
            continue
        for attr in NAMES:
            if getattr(module, attr, None) is originals[attr]:
                setattr(module, attr, ours[attr])
                rebound.append(f"{name}.{attr}")
    return rebound


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get("KVPOOL_SWAP", "1") == "0":
        config._kvpool_swap = "stock vLLM classes (KVPOOL_SWAP=0)"
        return
    import kvpool

    rebound = swap()
    config._kvpool_swap = (
        f"kvpool {kvpool.__version__} ({'compiled' if kvpool.USING_EXTENSION else 'pure-Python'} "
        f"core) in place of vLLM's: {', '.join(rebound)}"
    )


def pytest_report_header(config: pytest.Config) -> str:
    return f"kvpool_swap: {config._kvpool_swap}"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # CPU only: vLLM's conftest empties the accelerator's memory after every
    # test unless it carries vLLM's own marker for tests that need no GPU.
    # Stock and swapped runs alike.
    for item in items:
        item.add_marker(pytest.mark.skip_global_cleanup)
