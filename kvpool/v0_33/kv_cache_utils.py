"""Hash helpers of the vLLM 0.33 line (mirrors ``vllm/v1/core/kv_cache_utils.py``).

Unchanged since 0.15.1, and shared with that line: the key packing
(``make_block_hash_with_group_id``, ``get_block_hash``, ``get_group_id``) and
``maybe_convert_block_hash``. What 0.33 changed:

- A coarser group's hash is the **last** ``hash_block_size`` hash inside its
  block (every hash already chains over its whole prefix), not the
  concatenation; ``resolve_block_hashes`` picks the view for a block size.
- KV events carry each block's *extra keys* (LoRA, multimodal items, cache
  salt, prompt-embeds digest). Block hashing uses them tagged
  (``("lora", name, path)``, ``("mm", identifier, offset)``, ...); events
  publish them untagged (``to_event_extra_keys``). The generators here
  reproduce vLLM 0.33's, reading the same request attributes, so that a
  kvpool pool emits the same events; they are this project's own code.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Sequence
from typing import Any

from ..hashing import (
    BlockHash,
    BlockHashWithGroupId,
    ExternalBlockHash,
    convert_block_hashes,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
)
from ..hashing import BlockHashListWithBlockSize as _ConcatenatingView

__all__ = [
    "BlockHash",
    "BlockHashWithGroupId",
    "ExternalBlockHash",
    "make_block_hash_with_group_id",
    "get_block_hash",
    "get_group_id",
    "maybe_convert_block_hash",
    "convert_block_hashes",
    "BlockHashListWithBlockSize",
    "BlockHashList",
    "resolve_block_hashes",
    "generate_block_hash_extra_keys",
    "generate_lookahead_block_hash_extra_keys",
    "to_event_extra_keys",
]


class BlockHashListWithBlockSize(_ConcatenatingView):
    """``block_hashes`` (computed every ``hash_block_size`` tokens) viewed at
    ``target_block_size``, a multiple of it. Since 0.24 the hash of a coarse
    block is the last fine hash inside it: that hash already chains over the
    whole prefix, so it fingerprints the coarse block too, and no bytes are
    joined per access."""

    __slots__ = ()

    def _get_value_at(self, idx: int) -> BlockHash:
        # Index, not slice: an index past the end must raise IndexError.
        return self.block_hashes[(idx + 1) * self.scale_factor - 1]


BlockHashList = list[BlockHash] | BlockHashListWithBlockSize


def resolve_block_hashes(
    block_hashes: BlockHashList,
    hash_block_size: int,
    block_size: int,
    *,
    supports_fine_grained_hash_lookup: bool = False,
    alignment_tokens: int | None = None,
) -> BlockHashList:
    """The view of ``block_hashes`` at ``block_size``: the list itself at
    ``hash_block_size`` (or for fine-grained partial lookups, which keep the
    raw hashes), else a ``BlockHashListWithBlockSize``."""
    if block_size == hash_block_size:
        return block_hashes
    scale, rest = divmod(block_size, hash_block_size) if hash_block_size > 0 else (0, 1)
    if isinstance(block_hashes, BlockHashListWithBlockSize):
        if block_hashes.scale_factor != scale or rest:
            raise ValueError(
                f"a view at scale {block_hashes.scale_factor} cannot serve block_size "
                f"{block_size} (hash_block_size {hash_block_size})"
            )
        return block_hashes
    if (
        supports_fine_grained_hash_lookup
        and alignment_tokens is not None
        and alignment_tokens < block_size
        and block_size % alignment_tokens == 0
    ):
        return block_hashes
    return BlockHashListWithBlockSize(block_hashes, hash_block_size, block_size)


def _mm_end(feature: Any) -> int:
    pos = feature.mm_position
    return pos.offset + pos.length


def _mm_extra_keys(
    request: Any, start: int, end: int, start_mm_idx: int
) -> tuple[list[Any], int]:
    """The ``("mm", identifier, offset in block)`` keys of the multimodal
    items overlapping tokens ``[start, end)``, walking from item
    ``start_mm_idx`` (negative: from the end); and the item to start the next
    block from. Items are sorted by offset and do not overlap."""
    keys: list[Any] = []
    features = request.mm_features
    if not features or _mm_end(features[-1]) <= start:
        return keys, start_mm_idx
    idx = start_mm_idx
    if idx < 0:
        if -idx > len(features):
            raise ValueError(f"start_mm_idx {start_mm_idx} is out of range")
        idx += len(features)
    while idx < len(features):
        feature = features[idx]
        if feature.identifier is None:
            raise ValueError("a multimodal feature without an identifier cannot be hashed")
        offset = feature.mm_position.offset
        item_end = offset + feature.mm_position.length
        if end <= offset:
            break  # the block ends before this item
        if start >= item_end:
            idx += 1  # the block starts after this item
            continue
        keys.append(("mm", feature.identifier, offset - start))
        if end < item_end:
            break  # the item goes on into the next block
        idx += 1
    return keys, idx


def _prompt_embeds_key(request: Any, start: int, end: int) -> list[tuple[str, bytes]]:
    embeds = request.prompt_embeds
    if embeds is None:
        return []
    cache = request._prompt_embeds_per_block_hashes
    digest = cache.get((start, end))
    if digest is None:
        raw = embeds[start:end].flatten().cpu().contiguous()
        import torch  # only requests with prompt embeds carry a tensor

        digest = hashlib.sha256(raw.view(torch.uint8).numpy().data).digest()
        cache[(start, end)] = digest
    return [("prompt_embeds", digest)]


def generate_block_hash_extra_keys(
    request: Any, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]:
    """The tagged extra keys of the block ``[start_token_idx, end_token_idx)``
    of ``request`` -- LoRA, multimodal items, the cache salt (first block
    only), the prompt-embeds digest, in that order -- or None; and the
    multimodal item the next block starts from."""
    mm_keys, next_mm_idx = _mm_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx)
    keys: list[Any] = []
    lora = request.lora_request
    if lora:
        keys.append(("lora", lora.lora_name, lora.lora_path))
    keys.extend(mm_keys)
    if start_token_idx == 0 and request.cache_salt:
        keys.append(("cache_salt", request.cache_salt))
    keys.extend(_prompt_embeds_key(request, start_token_idx, end_token_idx))
    return (tuple(keys) if keys else None), next_mm_idx


def generate_lookahead_block_hash_extra_keys(
    request: Any,
    start_token_idx: int,
    end_token_idx: int,
    hash_end_token_idx: int,
    start_mm_idx: int,
) -> tuple[tuple[Any, ...] | None, int]:
    """Extra keys of a block whose hash also covers lookahead tokens up to
    ``hash_end_token_idx``; the next block starts again from the first item
    that reaches past ``end_token_idx``."""
    keys, mm_idx = generate_block_hash_extra_keys(
        request, start_token_idx, hash_end_token_idx, start_mm_idx
    )
    while mm_idx > 0 and _mm_end(request.mm_features[mm_idx - 1]) > end_token_idx:
        mm_idx -= 1
    return keys, mm_idx


def mm_features_window(features: Sequence[Any], start: int, end: int) -> tuple[int, int]:
    """``(lo, hi)``: the features overlapping ``[start, end)`` are
    ``features[lo:hi]`` (sorted, non-overlapping features)."""
    lo = bisect.bisect_left(features, start + 1, key=_mm_end)
    hi = bisect.bisect_left(features, end, key=lambda f: f.mm_position.offset)
    return lo, hi


def to_event_extra_keys(
    extra_keys: Iterable[tuple[Any, ...] | None] | None,
) -> list[tuple[Any, ...] | None] | None:
    """Per block, the extra keys as KV events publish them: untagged (a bare
    LoRA name, cache salt or digest, an ``(identifier, offset)`` pair for a
    multimodal item); None for no entries."""
    if not extra_keys:
        return None
    event_keys = [
        None if keys is None else tuple(key[1:] if key[0] == "mm" else key[1] for key in keys)
        for keys in extra_keys
    ]
    return event_keys or None
