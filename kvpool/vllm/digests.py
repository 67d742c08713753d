"""The vLLM code kvpool goes into, by its bytes rather than its version string.

kvpool mirrors vLLM's pool and manager and patches a few call sites; what
it was proven against is the content of those files (``MIRRORED``), not a
version label: a patched build called ``0.34.0+corp`` is other code, a
nightly may be the same code as a release. ``RELEASE_DIGESTS``
(``kvpool/vllm/_release_digests.py``, written by
``tools/release_digests.py`` from each listed release's own files, and by
``tools/intake.py --apply`` for a release it adds) holds the SHA-256 of every
mirrored file of every listed release; ``installed_digests()`` hashes the
installed vLLM's (once per process); ``identify()`` says which listed
release, if any, the installed code is, and where it is not, which files
differ from the nearest one.

Standard library only, and nothing of vLLM is imported: the files are found
through the import system's spec of the ``vllm`` package.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "MIRRORED",
    "CodeVerdict",
    "code_line",
    "file_digests",
    "identify",
    "installed_digests",
    "release_digests",
]

#: Every vLLM file kvpool mirrors or patches, relative to the ``vllm``
#: package directory, with what kvpool takes from it (the one list:
#: ``tools/intake.py`` diffs these files, under ``vllm/``).
MIRRORED: tuple[tuple[str, str], ...] = (
    ("v1/core/block_pool.py", "the pool: every line's facade"),
    ("v1/core/kv_cache_utils.py", "blocks, free queue, hash helpers, the request block hasher"),
    ("distributed/kv_events.py", "the events (byte-identical)"),
    ("v1/core/kv_cache_metrics.py", "the metrics collector"),
    ("v1/core/kv_cache_manager.py", "KVCacheManager (kvpool's, 0.30 on)"),
    ("v1/core/kv_cache_coordinator.py", "builds the pool through the name install() rebinds"),
    ("v1/core/single_type_kv_cache_manager.py", "the single-type managers that drive the pool"),
    ("utils/hashing.py", "the hash functions kvpool's hasher reproduces"),
    ("v1/engine/core.py", "the hasher's call site"),
    ("v1/core/sched/scheduler.py", "the scheduler's construction site"),
)

#: What a missing file's digest reads as.
MISSING = "missing"

_lock = threading.Lock()
_installed: list[dict[str, str]] = []


def file_digests(package_dir: str | Path) -> dict[str, str]:
    """SHA-256 (hex) of each ``MIRRORED`` file under ``package_dir`` (a
    ``vllm`` package directory), ``MISSING`` for a file that is not there."""
    root = Path(package_dir)
    out = {}
    for path, _ in MIRRORED:
        try:
            data = (root / path).read_bytes()
        except FileNotFoundError:
            out[path] = MISSING
        else:
            out[path] = hashlib.sha256(data).hexdigest()
    return out


def vllm_package_dir() -> Path:
    """The ``vllm`` package's directory: the imported one's, else the one
    the import system would load (found without importing it)."""
    module = sys.modules.get("vllm")
    where = getattr(module, "__file__", None) if module is not None else None
    if where:
        return Path(where).parent
    try:
        spec = importlib.util.find_spec("vllm")
    except ValueError:  # a module without a spec in sys.modules
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("no vLLM package found: kvpool has no code to check")
    return Path(next(iter(spec.submodule_search_locations)))


def installed_digests() -> dict[str, str]:
    """``file_digests`` of the installed vLLM, computed once per process
    (about 1 MB of files)."""
    with _lock:
        if not _installed:
            _installed.append(file_digests(vllm_package_dir()))
        return dict(_installed[0])


def release_digests() -> dict[str, dict[str, str]]:
    """release -> its ``file_digests``, for every release ``VLLM_LINES``
    lists (a release taken out of the lines is no longer accepted by its
    code either)."""
    from ._release_digests import RELEASE_DIGESTS
    from .releases import VLLM_LINES

    listed = {release for line in VLLM_LINES for release in line.releases}
    return {release: dict(zip((p for p, _ in MIRRORED), row)) for release, row in
            RELEASE_DIGESTS.items() if release in listed}


@dataclass(frozen=True)
class CodeVerdict:
    """What the installed code is: ``release`` when every mirrored file is
    that listed release's (the newest such release when several share the
    files); else ``None``, with ``nearest`` the listed release differing in
    the fewest files (the newer on a tie) and ``differing`` those files."""

    release: str | None
    nearest: str | None = None
    differing: tuple[str, ...] = field(default=())

    def describe(self) -> str:
        if self.release is not None:
            return f"the code of vLLM {self.release}"
        files = ", ".join(f"vllm/{p}" for p in self.differing)
        return (f"not the code of a release kvpool lists: {files} "
                f"{'differs' if len(self.differing) == 1 else 'differ'} from vLLM {self.nearest}'s")


def _key(release: str) -> tuple[int, ...]:
    return tuple(int(x) for x in release.split("."))


def identify(digests: dict[str, str], known: dict[str, dict[str, str]] | None = None
             ) -> CodeVerdict:
    """Which listed release's code ``digests`` (``file_digests``) is."""
    known = release_digests() if known is None else known
    best: tuple[int, tuple[int, ...], str, tuple[str, ...]] | None = None
    for release in sorted(known, key=_key, reverse=True):
        differing = tuple(p for p, _ in MIRRORED if known[release].get(p) != digests.get(p))
        if not differing:
            return CodeVerdict(release)
        # fewest differing files, then the newest release
        candidate = (len(differing), tuple(-x for x in _key(release)), release, differing)
        if best is None or candidate < best:
            best = candidate
    if best is None:
        return CodeVerdict(None)
    return CodeVerdict(None, best[2], best[3])


def code_line(version: str | None = None, *, force: bool = False,
              digests: dict[str, str] | None = None) -> tuple[object, str]:
    """The line kvpool puts into the installed vLLM, decided by its code,
    and what decided it: the line of the listed release whose mirrored files
    the installed ones are, byte for byte (whatever ``version``, the
    installed ``vllm.__version__``, says). Any other code raises
    ``UnsupportedVLLMVersionError`` naming the files that differ from the
    nearest listed release (its ``code`` attribute says what the code is),
    unless the user proved exactly this build with this kvpool
    (``kvpool.vllm.proven``: it gets the line it was proven against); ``force=True`` gives it the line
    ``vllm_line(version, force=True)`` gives. Under the release intake's
    alias (``KVPOOL_VLLM_INTAKE=VERSION=LISTED``) VERSION gets LISTED's line,
    its code unchecked: the intake is deciding about it."""
    from .releases import (
        INTAKE_VAR,
        UnsupportedVLLMVersionError,
        intake_alias,
        line_named,
        vllm_line,
        vllm_version,
    )

    if version is None:
        version = vllm_version()
    alias = intake_alias()
    if alias is not None and alias[0].split("+")[0] == version.split("+")[0]:
        return vllm_line(version), f"the release intake's alias {INTAKE_VAR}={alias[0]}={alias[1]}"
    if digests is None:
        digests = installed_digests()
    verdict = identify(digests)
    if verdict.release is not None:
        return vllm_line(verdict.release), verdict.describe()
    from .proven import RecordError, find

    try:
        build, not_proven = find(digests)
    except RecordError as exc:
        build, not_proven = None, str(exc)
    if build is not None:
        return line_named(build.line), build.describe()
    if force:
        return vllm_line(version, force=True), f"forced: {verdict.describe()}"
    code = verdict.describe() + (f"; {not_proven}" if not_proven else "")
    error = UnsupportedVLLMVersionError(
        f"kvpool goes only into vLLM code it was proven against; vLLM {version} here is "
        f"{code}. Prove this build (python -m kvpool.vllm --prove), install a listed "
        f"release (pip install 'kvpool[vllm]'), or leave kvpool out of this engine (unset "
        f"KVPOOL_VLLM), or of every engine whose code it does not know (KVPOOL_VLLM=auto)."
    )
    error.code = code
    raise error
