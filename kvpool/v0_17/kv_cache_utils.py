"""Extra keys of the vLLM 0.17 line (mirrors ``vllm/v1/core/kv_cache_utils.py``).

From 0.17 a ``BlockStored`` event lists, per stored block, the *extra keys*
vLLM mixed into that block's hash, so the generator that computes them is
part of what the pool reproduces. This is kvpool's own version of vLLM
0.17's ``generate_block_hash_extra_keys``, reading the same request
attributes (``lora_request``, ``mm_features``, ``cache_salt``,
``prompt_embeds``); a request object without one of them counts as not
having it. 0.17 and 0.18 share these rules; 0.19 changed the multimodal part
(``kvpool.v0_19.kv_cache_utils``). The key packing and hash conversion are
the 0.15 line's (``kvpool.hashing``), unchanged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

__all__ = [
    "ExtraKeysGenerator",
    "generate_block_hash_extra_keys",
    "block_extra_keys",
    "has_extra_keys",
    "mm_extra_keys",
    "prompt_embeds_digest",
]

#: ``(request, start_token_idx, end_token_idx, start_mm_idx) -> (keys, next_mm_idx)``
ExtraKeysGenerator = Callable[[Any, int, int, int], tuple["tuple[Any, ...] | None", int]]
#: The multimodal part of a generator: ``(request, start, end, start_mm_idx) -> (keys, next)``.
MMKeys = Callable[[Any, int, int, int], tuple[list[Any], int]]


def has_extra_keys(request: Any) -> bool:
    """Whether any block of ``request`` can have extra keys (else every
    block's are None: the common case, decided once per call)."""
    return bool(
        getattr(request, "lora_request", None)
        or getattr(request, "mm_features", None)
        or getattr(request, "cache_salt", None)
        or getattr(request, "prompt_embeds", None) is not None
    )


def mm_extra_keys(
    request: Any,
    start: int,
    end: int,
    start_mm_idx: int,
    *,
    item_key: Callable[[Any, int], Any],
    touching_counts: bool,
) -> tuple[list[Any], int]:
    """The keys (``item_key(feature, start)``) of the multimodal items
    overlapping the block ``[start, end)``, walking from item
    ``start_mm_idx`` (negative: from the end), and the item the next block
    starts from. Items are sorted by offset and do not overlap;
    ``touching_counts``: an item ending exactly where the block starts
    counts for it too (vLLM before 0.19)."""
    keys: list[Any] = []
    features = getattr(request, "mm_features", None)
    if not features:
        return keys, start_mm_idx
    # Past the last item's end (or at it, since 0.19): nothing to walk.
    last = features[-1].mm_position
    if last.offset + last.length + touching_counts <= start:
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
        if item_end + touching_counts <= start:
            idx += 1  # the block starts after this item
            continue
        keys.append(item_key(feature, start))
        if end < item_end:
            break  # the item goes on into the next block
        idx += 1
    return keys, idx


def _mm_extra_keys(request: Any, start: int, end: int, start_mm_idx: int) -> tuple[list[Any], int]:
    # vLLM 0.17/0.18: an item is keyed by its identifier alone.
    return mm_extra_keys(
        request, start, end, start_mm_idx,
        item_key=lambda feature, _start: feature.identifier, touching_counts=True,
    )


def prompt_embeds_digest(request: Any, start: int, end: int) -> list[bytes]:
    """``[sha256 of the block's prompt-embeds bytes]``, or ``[]`` without
    prompt embeds; cached on the request per token range, as vLLM does (its
    hasher and its pool then share the digest)."""
    embeds = getattr(request, "prompt_embeds", None)
    if embeds is None:
        return []
    cache = request._prompt_embeds_per_block_hashes
    digest = cache.get((start, end))
    if digest is None:
        import torch  # only requests with prompt embeds carry a tensor

        raw = embeds[start:end].flatten().contiguous().view(torch.uint8).numpy().data
        digest = cache[(start, end)] = hashlib.sha256(raw).digest()
    return [digest]


def block_extra_keys(
    mm_keys: MMKeys, request: Any, start: int, end: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]:
    """The extra keys of the block ``[start, end)`` -- the LoRA name, the
    multimodal keys (``mm_keys``), the cache salt (first block only), the
    prompt-embeds digest, in that order -- or None; and the multimodal item
    the next block starts from."""
    mm, next_mm_idx = mm_keys(request, start, end, start_mm_idx)
    keys: list[Any] = []
    lora = getattr(request, "lora_request", None)
    if lora:
        keys.append(lora.lora_name)
    keys.extend(mm)
    salt = getattr(request, "cache_salt", None)
    if start == 0 and salt:
        keys.append(salt)
    keys.extend(prompt_embeds_digest(request, start, end))
    return (tuple(keys) if keys else None), next_mm_idx


def generate_block_hash_extra_keys(
    request: Any, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]:
    """vLLM 0.17's extra keys of the block ``[start_token_idx, end_token_idx)``
    and the multimodal item the next block starts from."""
    return block_extra_keys(_mm_extra_keys, request, start_token_idx, end_token_idx, start_mm_idx)
