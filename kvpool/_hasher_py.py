"""The pure-Python twin of ``kvpool._hasher``: the same functions, computed
the way vLLM computes them (``pickle`` / ``cbor2`` and ``hashlib`` /
``xxhash``). Used when the extension is not built or
``KVPOOL_NO_EXTENSIONS`` is set, and as the tests' second implementation.
``cbor2`` and ``xxhash`` are imported only when an algorithm needs them."""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable
from typing import Any

ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
ALGORITHM_CODES = {name: code for code, name in enumerate(ALGORITHMS)}
SHA256_BACKEND = "hashlib"


def _code(algorithm: str | int) -> int:
    if type(algorithm) is int and 0 <= algorithm < 4:
        return algorithm
    code = ALGORITHM_CODES.get(algorithm)  # type: ignore[arg-type]
    if code is None:
        raise ValueError(f"unknown hash algorithm {algorithm!r}; expected one of {ALGORITHMS}")
    return code


def serialize(obj: Any, algorithm: str | int = "sha256") -> bytes:
    if _code(algorithm) & 1:
        import cbor2

        return cbor2.dumps(obj, canonical=True)
    return pickle.dumps(obj, protocol=5)


def digest(data: Any, algorithm: str | int = "sha256") -> bytes:
    if _code(algorithm) & 2:
        import xxhash

        return xxhash.xxh3_128_digest(bytes(data))
    return hashlib.sha256(data).digest()


def hash_object(obj: Any, algorithm: str | int, fallback: Callable[[Any], bytes] | None) -> bytes:
    return digest(serialize(obj, algorithm), algorithm)


def hash_blocks(
    algorithm: str | int,
    parent: bytes,
    token_ids: list[int],
    block_size: int,
    num_blocks: int,
    extra_keys: list[Any] | None,
    fallback: Callable[[Any], bytes] | None,
    start: int = 0,
) -> list[bytes]:
    if block_size < 1 or num_blocks < 0 or start < 0:
        raise ValueError("block_size must be >= 1, num_blocks and start >= 0")
    if len(token_ids) - start < num_blocks * block_size:
        raise ValueError(
            f"token_ids holds {len(token_ids) - start} tokens from {start}, "
            f"fewer than {num_blocks} blocks of {block_size}"
        )
    if extra_keys is not None and len(extra_keys) < num_blocks:
        raise ValueError("extra_keys must have one entry per block")
    code = _code(algorithm)
    result = []
    for i in range(num_blocks):
        extra = None if extra_keys is None else extra_keys[i]
        first = start + i * block_size
        block = tuple(token_ids[first : first + block_size])
        parent = digest(serialize((parent, block, extra), code), code)
        result.append(parent)
    return result
