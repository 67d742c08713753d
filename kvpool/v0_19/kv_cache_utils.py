"""Extra keys of the vLLM 0.19 line (mirrors ``vllm/v1/core/kv_cache_utils.py``).

0.19 changed the multimodal part of a block's extra keys: an item is keyed
as ``(identifier, offset of the item relative to the block's start)`` (the
same image at two positions in otherwise equal placeholder blocks must not
share a hash), and an item that ends exactly where a block starts no longer
counts for that block. The LoRA, cache-salt and prompt-embeds keys are 0.17's.
"""

from __future__ import annotations

from typing import Any

from ..v0_17.kv_cache_utils import block_extra_keys

__all__ = ["generate_block_hash_extra_keys"]


def _mm_extra_keys(request: Any, start: int, end: int, start_mm_idx: int) -> tuple[list[Any], int]:
    """The ``(identifier, offset in block)`` keys of the multimodal items
    overlapping the block ``[start, end)``, walking from item
    ``start_mm_idx`` (negative: from the end), and the item the next block
    starts from. Items are sorted by offset and do not overlap."""
    keys: list[Any] = []
    features = getattr(request, "mm_features", None)
    if not features:
        return keys, start_mm_idx
    last = features[-1].mm_position
    if last.offset + last.length <= start:
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
            idx += 1  # the block starts at or after this item's end
            continue
        keys.append((feature.identifier, offset - start))
        if end < item_end:
            break  # the item goes on into the next block
        idx += 1
    return keys, idx


def generate_block_hash_extra_keys(
    request: Any, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]:
    """vLLM 0.19's extra keys of the block ``[start_token_idx, end_token_idx)``
    and the multimodal item the next block starts from."""
    return block_extra_keys(_mm_extra_keys, request, start_token_idx, end_token_idx, start_mm_idx)
