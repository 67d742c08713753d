"""Put kvpool's ``BlockPool`` into vLLM's scheduler.

vLLM 0.15.x builds its ``BlockPool`` in exactly one place,
``vllm.v1.core.kv_cache_coordinator`` (positionally:
``BlockPool(num_blocks, enable_caching, hash_block_size,
enable_kv_cache_events, metrics_collector)``), and reaches it only through the
name ``BlockPool`` bound in that module. ``install()`` rebinds that name (and
the same name in ``vllm.v1.core.single_type_kv_cache_manager``, where it only
annotates arguments, so that the two modules never disagree); ``uninstall()``
puts vLLM's class back. ``vllm.v1.core.block_pool.BlockPool`` itself is left
alone: vLLM's own pool stays importable, e.g. to compare the two.

Three ways in::

    import kvpool.vllm
    kvpool.vllm.install()            # every KVCacheManager built from now on

    with kvpool.vllm.enabled():      # only inside the block
        ...

    # no code change: the ``vllm.general_plugins`` entry point runs
    # ``plugin()`` in every vLLM process; it installs when KVPOOL_VLLM=1.

Install before vLLM builds its engine: a ``KVCacheManager`` that already
exists keeps the pool it was built with. vLLM builds the scheduler in its
engine-core process, which it may *spawn* (a fresh interpreter that does not
inherit the patch); so ``install()`` also exports ``KVPOOL_VLLM`` for the
processes started while it is in effect, whose plugin loader then installs
kvpool there too (this needs kvpool pip-installed, for its entry point).
vLLM is imported here, never by ``import kvpool``, and is not a dependency of
the core package.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
from collections.abc import Iterator
from types import ModuleType
from typing import Any

__all__ = [
    "ENV_VAR",
    "SUPPORTED_VLLM",
    "UnsupportedVLLMVersionError",
    "check_vllm_version",
    "enabled",
    "install",
    "is_installed",
    "plugin",
    "uninstall",
    "vllm_version",
]

logger = logging.getLogger("kvpool.vllm")

#: The vLLM release line kvpool's pool is a drop-in for (major, minor).
SUPPORTED_VLLM = (0, 15)

#: ``1`` (or true/yes/on): the vLLM plugin installs kvpool in every vLLM
#: process; ``force``: the same without the version check; unset, empty or
#: anything else: the plugin does nothing.
ENV_VAR = "KVPOOL_VLLM"

# Modules whose global name ``BlockPool`` is rebound. The coordinator is the
# one that matters (it constructs the pool); the manager module only uses the
# name in annotations.
_PATCHED_MODULES = (
    "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.single_type_kv_cache_manager",
)

_lock = threading.RLock()
# module -> the object its ``BlockPool`` name held before install(); empty
# while not installed.
_originals: dict[ModuleType, Any] = {}
# ENV_VAR's value before install() exported it (None: it was unset).
_saved_env: list[str | None] = []


class UnsupportedVLLMVersionError(RuntimeError):
    """The installed vLLM is not a release kvpool's pool was built against."""


def vllm_version() -> str:
    """The version string of the importable vLLM (imports ``vllm``)."""
    import vllm

    return str(vllm.__version__)


def check_vllm_version(version: str | None = None) -> str:
    """Raise ``UnsupportedVLLMVersionError`` unless ``version`` (default: the
    installed vLLM's) is a 0.15.x release; return the version checked."""
    if version is None:
        version = vllm_version()
    match = re.match(r"\s*v?(\d+)\.(\d+)", version)
    if match is None or (int(match[1]), int(match[2])) != SUPPORTED_VLLM:
        wanted = ".".join(map(str, SUPPORTED_VLLM))
        raise UnsupportedVLLMVersionError(
            f"kvpool's BlockPool is a drop-in for vLLM {wanted}.x only; found "
            f"vLLM {version}. Install a supported vLLM (pip install "
            f"'kvpool[vllm]'), or leave kvpool out of this engine (unset "
            f"{ENV_VAR})."
        )
    return version


def _target_modules() -> list[ModuleType]:
    import importlib

    return [importlib.import_module(name) for name in _PATCHED_MODULES]


def install(*, force: bool = False) -> bool:
    """Make vLLM build kvpool's ``BlockPool`` in every ``KVCacheManager``
    created from now on, in this process.

    Checks the vLLM version first (``UnsupportedVLLMVersionError`` on anything
    but 0.15.x; ``force=True`` skips the check, at your own risk). Exports
    ``KVPOOL_VLLM`` (``1``, or ``force``) so that vLLM processes started from
    now on install it as well. Idempotent and thread-safe: returns ``True`` if
    this call installed the pool, ``False`` if it was already installed.
    """
    with _lock:
        if _originals:
            return False
        if not force:
            version = check_vllm_version()
        else:
            version = vllm_version()
        from kvpool import USING_EXTENSION, BlockPool

        modules = _target_modules()
        for module in modules:
            _originals[module] = module.BlockPool
        for module in modules:
            module.BlockPool = BlockPool
        _saved_env.append(os.environ.get(ENV_VAR))
        os.environ[ENV_VAR] = "force" if force else "1"
        logger.info(
            "kvpool BlockPool installed into vLLM %s (%s core)",
            version,
            "compiled" if USING_EXTENSION else "pure-Python",
        )
        return True


def uninstall() -> bool:
    """Give vLLM its own ``BlockPool`` back (for managers created from now
    on). Returns ``True`` if kvpool was installed, ``False`` if not."""
    with _lock:
        if not _originals:
            return False
        from kvpool import BlockPool

        for module, original in _originals.items():
            current = module.BlockPool
            if current is not BlockPool:
                # Someone patched over us; put back what we found anyway, so
                # uninstall() always leaves vLLM's own class in place.
                logger.warning(
                    "%s.BlockPool was replaced by %r after kvpool was installed; "
                    "restoring vLLM's own BlockPool",
                    module.__name__,
                    current,
                )
            module.BlockPool = original
        _originals.clear()
        previous = _saved_env.pop()
        if previous is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = previous
        logger.info("kvpool BlockPool uninstalled from vLLM")
        return True


def is_installed() -> bool:
    """Whether ``install()`` is in effect in this process."""
    return bool(_originals)


@contextlib.contextmanager
def enabled(*, force: bool = False) -> Iterator[None]:
    """Context manager: kvpool's pool is installed inside the block. Nests: it
    uninstalls on exit only if it was the one that installed."""
    installed_here = install(force=force)
    try:
        yield
    finally:
        if installed_here:
            uninstall()


def plugin() -> None:
    """The ``vllm.general_plugins`` entry point. vLLM calls it in each of its
    processes (front end, engine core, workers) before it builds the
    scheduler; it installs kvpool's pool when ``KVPOOL_VLLM=1`` (``force``:
    without the version check) and does nothing otherwise. An unsupported
    vLLM with ``KVPOOL_VLLM=1`` is an error, not a silent fallback to vLLM's
    pool."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value == "force":
        install(force=True)
    elif value in ("1", "true", "yes", "on"):
        install()
