from collections.abc import Callable
from typing import Any

ALGORITHMS: tuple[str, str, str, str]
ALGORITHM_CODES: dict[str, int]
SHA256_BACKEND: str

def _serializer_states() -> tuple[int, int]: ...
def _set_serializer_states(pickle_state: int, cbor_state: int) -> None: ...
def select_sha256_backend(name: str) -> str: ...
def serialize(obj: Any, algorithm: str | int = "sha256") -> bytes | None: ...
def digest(data: Any, algorithm: str | int = "sha256") -> bytes: ...
def hash_object(
    obj: Any, algorithm: str | int, fallback: Callable[[Any], bytes]
) -> bytes: ...
def hash_blocks(
    algorithm: str | int,
    parent: bytes,
    token_ids: list[int],
    block_size: int,
    num_blocks: int,
    extra_keys: list[Any] | None,
    fallback: Callable[[Any], bytes],
    start: int = 0,
) -> list[bytes]: ...

class RequestBlockHasher:
    algorithm: int
    block_size: int
    lookahead: int
    kvpool: bool
    def __init__(
        self,
        algorithm: str | int,
        block_size: int,
        lookahead: int,
        none_hash_holder: Any,
        token_list_type: type | None,
        extra_keys: Callable[[Any, int, int], list[Any] | None],
        fallback: Callable[[Any], bytes],
        vllm_hasher: Callable[[Any], list[bytes]],
        token_buffer_type: type | None = None,
    ) -> None: ...
    def __call__(self, request: Any) -> list[bytes]: ...
