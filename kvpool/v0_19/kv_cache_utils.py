"""Extra keys of the vLLM 0.19 line (mirrors ``vllm/v1/core/kv_cache_utils.py``).

0.19 changed the multimodal part of a block's extra keys: an item is keyed
as ``(identifier, offset of the item relative to the block's start)`` (the
same image at two positions in otherwise equal placeholder blocks must not
share a hash), and an item that ends exactly where a block starts no longer
counts for that block. The LoRA, cache-salt and prompt-embeds keys are 0.17's.
"""

from __future__ import annotations

from typing import Any

from ..v0_17.kv_cache_utils import block_extra_keys, mm_extra_keys

__all__ = ["generate_block_hash_extra_keys"]


def _item_key(feature: Any, block_start: int) -> tuple[Any, int]:
    return (feature.identifier, feature.mm_position.offset - block_start)


def _mm_extra_keys(request: Any, start: int, end: int, start_mm_idx: int) -> tuple[list[Any], int]:
    return mm_extra_keys(
        request, start, end, start_mm_idx, item_key=_item_key, touching_counts=False
    )


def generate_block_hash_extra_keys(
    request: Any, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]:
    """vLLM 0.19's extra keys of the block ``[start_token_idx, end_token_idx)``
    and the multimodal item the next block starts from."""
    return block_extra_keys(_mm_extra_keys, request, start_token_idx, end_token_idx, start_mm_idx)
