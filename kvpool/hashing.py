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


def _use_int_block_hashes() -> bool:
    # Inside a vLLM process, ask vLLM's own envs module, so kvpool reads the
    # variable exactly when vLLM would (once, after the engine has enabled
    # its environment cache). Elsewhere read it on every call, as vLLM's
    # envs module does without that cache.
    envs = sys.modules.get("vllm.envs")
    if envs is not None:
        return bool(envs.VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES)
    return bool(int(os.getenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")))


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
