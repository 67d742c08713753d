"""Put kvpool's compiled request block hasher into vLLM's engine core.

vLLM's engine core builds the function that hashes every request's blocks
once, in ``EngineCore.__init__``, by calling ``get_request_block_hasher``
through the name imported into ``vllm.v1.engine.core`` (every release
0.15.0 to 0.34.0 alike; no other module of the engine calls it). ``install_hasher()``
rebinds that name to :func:`get_request_block_hasher` below;
``uninstall_hasher()`` puts vLLM's function back. vLLM's own
``vllm.v1.core.kv_cache_utils.get_request_block_hasher`` is left alone.

The hashes are vLLM's, byte for byte: the same pickle / CBOR bytes, the same
digests, the ``NONE_HASH`` in ``kv_cache_utils`` at call time, and vLLM's
own code for the extra keys of a block (see :func:`get_request_block_hasher`).
Install before the engine core is built (``kvpool.vllm.install()`` does it,
on every line whose ``VLLMLine.hasher`` is set: all of them);
``KVPOOL_VLLM_HASHER=0`` (or false/no/off) keeps vLLM's hasher.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from ._rebind import Rebinding
from .releases import VLLM_LINES, UnsupportedVLLMVersionError, VLLMLine, vllm_line

__all__ = [
    "ENV_VAR",
    "SUPPORTED_VLLM_LINES",
    "get_request_block_hasher",
    "hasher_declined",
    "hasher_enabled",
    "hasher_installed",
    "install_hasher",
    "uninstall_hasher",
]

logger = logging.getLogger("kvpool.vllm")

#: ``0`` / false / no / off: keep vLLM's own request block hasher.
ENV_VAR = "KVPOOL_VLLM_HASHER"

#: The (major, minor) series of the releases whose lines install the hasher
#: (``VLLMLine.hasher`` in ``kvpool.vllm.VLLM_LINES``, the one source); kept
#: for code written when this module had its own list.
SUPPORTED_VLLM_LINES = tuple(sorted({
    tuple(int(part) for part in release.split(".")[:2])
    for line in VLLM_LINES if line.hasher for release in line.releases
}))

_lock = threading.RLock()
_rebinding = Rebinding("get_request_block_hasher", ("vllm.v1.engine.core",),
                       "request block hasher")


def hasher_enabled() -> bool:
    """False when ``KVPOOL_VLLM_HASHER`` says to keep vLLM's hasher."""
    return os.environ.get(ENV_VAR, "").strip().lower() not in ("0", "false", "no", "off")


def _compiled_hasher() -> ModuleType | None:
    from .. import hashing

    module = hashing._hasher()
    return module if module.__name__ == "kvpool._hasher" else None


# vLLM's own get_request_block_hasher, kept in case kv_cache_utils' name is
# itself rebound to kvpool's (a test harness may do that): kvpool's function
# must never call itself as "vLLM's".
_vllm_factory: list[Callable[..., Any]] = []


def _vllm_get_request_block_hasher(kv_cache_utils: ModuleType) -> Callable[..., Any]:
    current = kv_cache_utils.get_request_block_hasher
    if current is not get_request_block_hasher:
        _vllm_factory[:] = [current]
        return current
    if not _vllm_factory:
        raise RuntimeError(
            "vllm.v1.core.kv_cache_utils.get_request_block_hasher is kvpool's, "
            "and vLLM's own was never seen"
        )
    return _vllm_factory[0]


def get_request_block_hasher(
    hash_block_size: int,
    caching_hash_fn: Callable[[Any], bytes],
    num_hash_lookahead_tokens: int = 0,
) -> Callable[[Any], list[bytes]]:
    """vLLM's ``get_request_block_hasher`` (same signature; 0.15/0.16 pass no
    ``num_hash_lookahead_tokens``), computing the hashes in C.

    For one of vLLM's four hash functions the returned function hashes the
    new full blocks of a request in one C call. Their extra keys come from
    vLLM's own code, by the cheapest exact route:

    * none (no LoRA, cache salt, multimodal input or prompt embeds, no
      lookahead): ``None`` for every block;
    * only LoRA and/or cache salt: ``generate_block_hash_extra_keys`` for the
      first new block and the one after it, since the keys then depend only
      on whether a block starts at token 0;
    * multimodal, prompt embeds or lookahead: vLLM's own block hasher runs
      with a hash function that records each block's extra keys instead of
      hashing (the hashing, the expensive part, stays in C).

    Any other ``caching_hash_fn``, or no compiled hasher: vLLM's own hasher.
    A block whose bytes the C serialiser does not reproduce is hashed by
    ``caching_hash_fn`` itself.
    """
    from vllm.utils import hashing as vllm_hashing
    from vllm.v1.core import kv_cache_utils

    original = _vllm_get_request_block_hasher(kv_cache_utils)
    lookahead = num_hash_lookahead_tokens
    extra_args = (lookahead,) if lookahead else ()
    codes = {
        getattr(vllm_hashing, name, None): code
        for code, name in enumerate(("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"))
    }
    algorithm = codes.get(caching_hash_fn)
    hasher = _compiled_hasher()
    if algorithm is None or hasher is None:
        return original(hash_block_size, caching_hash_fn, *extra_args)

    def extra_keys(request: Any, start: int, num_blocks: int) -> list[Any] | None:
        if lookahead or request.mm_features or request.prompt_embeds is not None:
            keys: list[Any] = []

            def record(block: tuple) -> bytes:
                keys.append(block[2])
                return b"\x01"  # any non-empty hash: the chain is not used

            original(hash_block_size, record, *extra_args)(request)
            # A different count: vLLM's loop changed shape; let it hash.
            return keys if len(keys) == num_blocks else None
        generate = kv_cache_utils.generate_block_hash_extra_keys
        first = generate(request, start, start + hash_block_size, 0)[0]
        rest = first
        if start == 0 and num_blocks > 1:
            rest = generate(request, hash_block_size, 2 * hash_block_size, 0)[0]
        return [first] + [rest] * (num_blocks - 1)

    try:
        from vllm.v1.utils import ConstantList as token_list_type
    except ImportError:
        token_list_type = None
    try:  # 0.34: a request's tokens are an int32 TokenBuffer (an array('i'))
        from vllm.v1.token_buffer import TokenBuffer as token_buffer_type
    except ImportError:
        token_buffer_type = None
    return hasher.RequestBlockHasher(
        algorithm,
        hash_block_size,
        lookahead,
        kv_cache_utils,
        token_list_type,
        extra_keys,
        caching_hash_fn,
        original(hash_block_size, caching_hash_fn, *extra_args),
        token_buffer_type,
    )


def hasher_declined(line: VLLMLine) -> str | None:
    """Why ``install_hasher()`` would leave vLLM's hasher in on a release of
    ``line``, or ``None`` if it would put kvpool's in (``python -m
    kvpool.vllm`` prints it)."""
    if not hasher_enabled():
        return f"{ENV_VAR}={os.environ.get(ENV_VAR)}: vLLM keeps its own request block hasher"
    if _compiled_hasher() is None:
        return "kvpool's compiled hasher is not available (not built, or KVPOOL_NO_EXTENSIONS)"
    if not line.hasher:
        return f"kvpool's hasher is not proven for the {line.name} line: vLLM keeps its own"
    return None


def install_hasher(line: VLLMLine | None = None, *, force: bool = False) -> bool:
    """Make vLLM engine cores built from now on (in this process) hash
    requests with kvpool's compiled hasher. ``line``: the installed vLLM's
    line (default: ``vllm_line()``, which refuses a release kvpool does not
    list; ``force=True`` takes the nearest older line's). Returns ``True``
    if this call installed it; ``False`` if it was installed already, if
    ``KVPOOL_VLLM_HASHER=0``, if the compiled hasher is not available (no
    extension, or ``KVPOOL_NO_EXTENSIONS``), if the release is not listed,
    or if its line does not install the hasher (``hasher_declined``)."""
    with _lock:
        if _rebinding.installed:
            return False
        if line is None:
            try:
                line = vllm_line(force=force)
            except UnsupportedVLLMVersionError as exc:
                logger.warning("vLLM keeps its own request block hasher: %s", exc)
                return False
        reason = hasher_declined(line)
        if reason is not None:
            logger.info("%s", reason)
            return False
        from vllm.v1.core import kv_cache_utils

        _vllm_get_request_block_hasher(kv_cache_utils)  # remember vLLM's own
        _rebinding.install(get_request_block_hasher)
        logger.info("kvpool request block hasher installed into vLLM")
        return True


def uninstall_hasher() -> bool:
    """Give vLLM's engine core its own hasher back (for engines built from
    now on). Returns ``True`` if kvpool's was installed."""
    with _lock:
        return _rebinding.uninstall()


def hasher_installed() -> bool:
    """Whether ``install_hasher()`` is in effect in this process."""
    return _rebinding.installed
