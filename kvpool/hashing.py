"""Block-hash keys: the byte strings the prefix cache is indexed by.

A block's hash (``BlockHash``) is opaque bytes computed by the engine. The
prefix cache is keyed by that hash with the KV-cache group id appended as four
big-endian bytes (``BlockHashWithGroupId``): packing into one ``bytes`` object
instead of a ``(hash, group)`` tuple keeps the key a single, untracked object
whose hash CPython caches, so dict lookups stay cheap and the GC never walks it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator, Sequence
from types import ModuleType
from typing import NewType, TypeAlias, overload

__all__ = [
    "BlockHash",
    "BlockHashWithGroupId",
    "ExternalBlockHash",
    "GROUP_ID_BYTES",
    "make_block_hash_with_group_id",
    "get_block_hash",
    "get_group_id",
    "maybe_convert_block_hash",
    "convert_block_hashes",
    "BlockHashListWithBlockSize",
    "HASH_ALGORITHMS",
    "DEFAULT_NONE_HASH_SEED",
    "hash_object",
    "none_hash",
    "hash_block_tokens",
    "hash_request_tokens",
]

BlockHash = NewType("BlockHash", bytes)
BlockHashWithGroupId = NewType("BlockHashWithGroupId", bytes)
# Hash values as published in KV events: 64-bit ints by default, raw bytes
# when VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0.
ExternalBlockHash: TypeAlias = bytes | int

# Width of the group id suffix; the compiled core relies on the same width.
GROUP_ID_BYTES = 4
_INT64_MASK = (1 << 64) - 1


def make_block_hash_with_group_id(
    block_hash: BlockHash, group_id: int
) -> BlockHashWithGroupId:
    """Pack ``block_hash`` and ``group_id`` (0 <= id < 2**32) into one key."""
    return BlockHashWithGroupId(
        block_hash + group_id.to_bytes(GROUP_ID_BYTES, "big", signed=False)
    )


def get_block_hash(key: BlockHashWithGroupId) -> BlockHash:
    """The block hash part of a key."""
    return BlockHash(key[:-GROUP_ID_BYTES])


def get_group_id(key: BlockHashWithGroupId) -> int:
    """The group id part of a key."""
    return int.from_bytes(key[-GROUP_ID_BYTES:], "big", signed=False)


_USE_INT_ENV = "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"
_MISSING = object()


def _use_int_block_hashes() -> bool:
    # Inside a vLLM process, ask vLLM's own envs module, so kvpool reads the
    # variable exactly when vLLM would (once, after the engine has enabled
    # its environment cache). Elsewhere read it on every call, as vLLM's
    # envs module does without that cache.
    #
    # The module is asked the way Python asks it -- its namespace first (a
    # test may set the attribute), then its ``__getattr__`` -- but without
    # the failing ordinary lookup before the ``__getattr__``: on Python 3.11
    # that builds and formats an AttributeError every time, some 70% of
    # this call's cost, and the events ask once per batch.
    envs = sys.modules.get("vllm.envs")
    if envs is None:
        return bool(int(os.getenv(_USE_INT_ENV, "1")))
    if type(envs) is not ModuleType:
        return bool(getattr(envs, _USE_INT_ENV))
    namespace = envs.__dict__
    value = namespace.get(_USE_INT_ENV, _MISSING)
    if value is _MISSING:
        hook = namespace.get("__getattr__")
        value = getattr(envs, _USE_INT_ENV) if hook is None else hook(_USE_INT_ENV)
    return bool(value)


def maybe_convert_block_hash(hash_bytes: BlockHash) -> ExternalBlockHash:
    """The form a hash takes in KV events: by default the low 64 bits of its
    big-endian integer value; the raw bytes when
    ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``."""
    if not _use_int_block_hashes():
        return hash_bytes
    return int.from_bytes(hash_bytes, byteorder="big") & _INT64_MASK


def convert_block_hashes(hashes: Iterable[BlockHash]) -> list[ExternalBlockHash]:
    """``[maybe_convert_block_hash(h) for h in hashes]``, reading the
    environment once for the whole list instead of once per hash (an engine
    converts every stored and evicted hash; the lookup cost more than the
    conversion). The low 64 bits of the big-endian value are the last eight
    bytes, so only those are converted."""
    if not _use_int_block_hashes():
        return list(hashes)
    return [int.from_bytes(h[-8:], "big") for h in hashes]


class BlockHashListWithBlockSize:
    """A read-only view of ``block_hashes`` (computed every
    ``hash_block_size`` tokens) at the granularity of ``target_block_size``,
    a multiple of it: hash ``i`` of the view is the concatenation of hashes
    ``i*k .. i*k+k-1`` of the original, ``k = target // hash_block_size``.

    Hybrid models give KV-cache groups different block sizes while the request
    hashes once, at the smallest; values are built lazily on access because a
    caller usually reads only the few new ones.
    """

    __slots__ = ("block_hashes", "scale_factor")

    def __init__(
        self,
        block_hashes: Sequence[BlockHash],
        hash_block_size: int,
        target_block_size: int,
    ) -> None:
        if hash_block_size < 1 or target_block_size % hash_block_size != 0:
            raise ValueError(
                f"target_block_size ({target_block_size}) must be a multiple of "
                f"hash_block_size ({hash_block_size})"
            )
        self.block_hashes = block_hashes
        self.scale_factor = target_block_size // hash_block_size

    def __len__(self) -> int:
        return len(self.block_hashes) // self.scale_factor

    @overload
    def __getitem__(self, idx: int) -> BlockHash: ...

    @overload
    def __getitem__(self, idx: slice) -> list[BlockHash]: ...

    def __getitem__(self, idx):
        if isinstance(idx, int):
            return self._get_value_at(idx)
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            return [self._get_value_at(i) for i in range(start, stop, step)]
        raise TypeError(f"Invalid index type: {type(idx)!r}")

    def __iter__(self) -> Iterator[BlockHash]:
        for i in range(len(self)):
            yield self._get_value_at(i)

    def _get_value_at(self, idx: int) -> BlockHash:
        # Indexed one by one, not sliced: an index past the end must raise
        # IndexError, and a negative one counts from the end of the original.
        hashes = self.block_hashes
        base = idx * self.scale_factor
        return BlockHash(
            b"".join([hashes[i] for i in range(base, base + self.scale_factor)])
        )


# --- Request block hashing -------------------------------------------------
#
# vLLM's prefix-cache keys, computed without vLLM: block i of a request is
# ``hash_fn((parent, tuple(tokens of block i), extra_keys_i))``, ``parent``
# being block i-1's hash (``NONE_HASH`` for the first block), ``hash_fn`` one
# of vLLM's four algorithms. The compiled ``kvpool._hasher`` writes the
# pickle / CBOR bytes and digests them in C; its pure-Python twin
# ``kvpool._hasher_py`` does what vLLM does. Inside vLLM,
# ``kvpool.vllm.hasher`` puts the same machinery behind vLLM's
# ``get_request_block_hasher``.

#: vLLM's ``prefix_caching_hash_algo`` values.
HASH_ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")

#: The seed vLLM >= 0.29 derives ``NONE_HASH`` from (when ``PYTHONHASHSEED``
#: is unset and the algorithm is of the SHA-256 family).
DEFAULT_NONE_HASH_SEED = "vllm-none-hash"

_hasher_module = None


def _hasher():
    """The compiled hasher, or its pure-Python twin when kvpool runs without
    extensions (the choice ``import kvpool`` made) or it is not built."""
    global _hasher_module
    if _hasher_module is None:
        import kvpool

        module = None
        if not kvpool.NO_EXTENSIONS:
            try:
                from . import _hasher as module
            except ImportError:
                module = None
        if module is None:
            from . import _hasher_py as module
        _hasher_module = module
    return _hasher_module


def _python_hash(algorithm: str):
    """``obj -> hash`` through Python's pickle / cbor2: the compiled hasher's
    fallback for a value whose bytes it does not reproduce."""
    from . import _hasher_py

    hasher = _hasher()

    def hash_fn(obj):
        return hasher.digest(_hasher_py.serialize(obj, algorithm), algorithm)

    return hash_fn


def hash_object(obj, algorithm: str = "sha256") -> bytes:
    """``vllm.utils.hashing.<algorithm>(obj)``: SHA-256 or XXH3-128 (16 bytes)
    of ``pickle.dumps(obj, protocol=5)`` or ``cbor2.dumps(obj,
    canonical=True)``. Values of other shapes than vLLM's (None, bool, int,
    bytes, str, tuples) are serialised by pickle / cbor2 themselves."""
    return _hasher().hash_object(obj, algorithm, _python_hash(algorithm))


def none_hash(algorithm: str = "sha256", seed: str = DEFAULT_NONE_HASH_SEED) -> BlockHash:
    """The parent hash of a request's first block as vLLM derives it from a
    seed: ``hash_fn(seed)``. The default is vLLM >= 0.29's for ``sha256`` and
    ``sha256_cbor`` without ``PYTHONHASHSEED``; with ``PYTHONHASHSEED`` set,
    every release uses that value as the seed. (vLLM 0.15-0.28 without
    ``PYTHONHASHSEED``, and the xxhash pair from 0.29, use random bytes: read
    ``vllm.v1.core.kv_cache_utils.NONE_HASH`` of the engine instead.)"""
    return BlockHash(hash_object(seed, algorithm))


_derive_none_hash = none_hash  # for the functions whose keyword shadows it


def hash_request_tokens(
    token_ids: Sequence[int],
    block_size: int,
    *,
    algorithm: str = "sha256",
    none_hash: bytes | None = None,
    parent_block_hash: bytes | None = None,
    extra_keys: Sequence[tuple | None] | None = None,
) -> list[BlockHash]:
    """The block hashes vLLM computes for a request whose tokens are
    ``token_ids``: one per *full* block of ``block_size`` tokens (vLLM's
    ``hash_block_size``), chained from ``parent_block_hash`` (the hash of the
    block before ``token_ids[0]``, if any) or else ``none_hash`` (default:
    ``none_hash(algorithm)``, see there). ``extra_keys``: one entry per full
    block (a tuple of vLLM's extra keys -- LoRA, multimodal, cache salt,
    prompt embeds -- or ``None``), or ``None`` for a plain request.

    For routers and tools that precompute prefix-cache or KV-connector keys:
    the results equal the engine's ``request.block_hashes``. Keys in the pool
    and in KV events are derived from them by ``make_block_hash_with_group_id``
    and ``maybe_convert_block_hash``.
    """
    if block_size < 1:
        raise ValueError("block_size must be >= 1")
    num_blocks = len(token_ids) // block_size
    parent = parent_block_hash or none_hash or _derive_none_hash(algorithm)
    if extra_keys is not None:
        extra_keys = list(extra_keys)
        if len(extra_keys) < num_blocks:
            raise ValueError(
                f"extra_keys has {len(extra_keys)} entries for {num_blocks} full blocks"
            )
    tokens = token_ids if type(token_ids) is list else list(token_ids)
    return _hasher().hash_blocks(
        algorithm, parent, tokens, block_size, num_blocks, extra_keys, _python_hash(algorithm)
    )


def hash_block_tokens(
    parent_block_hash: bytes | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple | None = None,
    *,
    algorithm: str = "sha256",
    none_hash: bytes | None = None,
) -> BlockHash:
    """One block's hash, as vLLM's ``hash_block_tokens``: a false
    ``parent_block_hash`` means the first block (``none_hash``, default
    ``none_hash(algorithm)``)."""
    parent = parent_block_hash or none_hash or _derive_none_hash(algorithm)
    return BlockHash(hash_object((parent, tuple(curr_block_token_ids), extra_keys), algorithm))
