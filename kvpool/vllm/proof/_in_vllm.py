"""A pool class, or a manager class, put where vLLM builds its own for the
length of a ``with`` block: through the very names ``kvpool.vllm.install()``
rebinds (``installer._PATCHED_MODULES``, ``manager._rebinding``), so that
what the suites prove is what ``install()`` puts in, and without touching
``install()``'s own state. Imports vLLM when a block is entered, not before.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

from .. import installer, manager

__all__ = ["manager_in_vllm", "pool_in_vllm"]


@contextlib.contextmanager
def _rebound(name: str, modules: tuple[str, ...], value: type) -> Iterator[None]:
    """The global ``name`` of each module of ``modules`` that has one is
    ``value`` inside the block."""
    loaded = [importlib.import_module(module) for module in modules]
    saved = [(module, getattr(module, name)) for module in loaded if hasattr(module, name)]
    for module, _ in saved:
        setattr(module, name, value)
    try:
        yield
    finally:
        for module, original in saved:
            setattr(module, name, original)


@contextlib.contextmanager
def pool_in_vllm(pool_class: type) -> Iterator[None]:
    """vLLM builds ``pool_class`` inside the block: the names it builds its
    pool through are rebound, as ``kvpool.vllm.install()`` does."""
    with _rebound("BlockPool", installer._PATCHED_MODULES, pool_class):
        yield


@contextlib.contextmanager
def manager_in_vllm(manager_class: type, pool_class: type) -> Iterator[None]:
    """vLLM's scheduler builds ``manager_class`` over ``pool_class`` inside
    the block, as ``kvpool.vllm.install()`` puts them in."""
    rebinding = manager._rebinding
    with _rebound(rebinding.name, rebinding.modules, manager_class), pool_in_vllm(pool_class):
        yield
