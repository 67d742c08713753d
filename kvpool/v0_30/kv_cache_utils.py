"""Hash helpers of vLLM 0.30 (mirrors ``vllm/v1/core/kv_cache_utils.py``):
the 0.31-0.33 helpers (``kvpool.v0_33.kv_cache_utils``), but the extra keys
of a block are **untagged**, and there is no ``to_event_extra_keys``.

vLLM 0.31 tagged each extra key with its source (``("lora", name, path)``,
``("mm", identifier, offset)``, ``("cache_salt", salt)``,
``("prompt_embeds", digest)``) and from then on untags them for the events.
0.30's keys are exactly those untagged forms (a bare LoRA name, an
``(identifier, offset)`` pair, the bare salt and digest), so 0.30's events
carry the same extra keys as 0.31's; only the hash inputs differ.
"""

from __future__ import annotations

from typing import Any

from ..v0_33.kv_cache_utils import (
    BlockHash,
    BlockHashList,
    BlockHashListWithBlockSize,
    BlockHashWithGroupId,
    ExternalBlockHash,
    get_block_hash,
    get_group_id,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
    resolve_block_hashes,
)
from ..v0_33.kv_cache_utils import generate_block_hash_extra_keys as _tagged_extra_keys
from ..v0_33.kv_cache_utils import to_event_extra_keys as _untagged

__all__ = [
    "BlockHash",
    "BlockHashWithGroupId",
    "ExternalBlockHash",
    "make_block_hash_with_group_id",
    "get_block_hash",
    "get_group_id",
    "maybe_convert_block_hash",
    "BlockHashListWithBlockSize",
    "BlockHashList",
    "resolve_block_hashes",
    "generate_block_hash_extra_keys",
]


def generate_block_hash_extra_keys(
    request: Any, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]:
    """The extra keys of the block ``[start_token_idx, end_token_idx)`` of
    ``request`` as vLLM 0.30 makes them -- the LoRA name, ``(identifier,
    offset in block)`` per multimodal item, the cache salt (first block
    only), the prompt-embeds digest, in that order -- or None; and the
    multimodal item the next block starts from."""
    keys, next_mm_idx = _tagged_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx)
    if keys is None:
        return None, next_mm_idx
    return _untagged([keys])[0], next_mm_idx
