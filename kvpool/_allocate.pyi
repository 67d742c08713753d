"""Type stubs of kvpool._allocate: vLLM's KVCacheManager.allocate_slots in C (see kvpool/_allocate.pyx)."""

from typing import Any

def allocate_slots(
    self: Any,
    request: Any,
    num_new_tokens: int,
    num_new_computed_tokens: int = 0,
    new_computed_blocks: Any | None = None,
    num_lookahead_tokens: int = 0,
    num_external_computed_tokens: int = 0,
    delay_cache_blocks: bool = False,
    num_encoder_tokens: int = 0,
    full_sequence_must_fit: bool = False,
    reserved_blocks: int = 0,
    has_scheduled_reqs: bool = True,
    skip_zeroing_group_ids: tuple[int, ...] = (),
) -> Any | None: ...
def allocate_slots_0_30(
    self: Any,
    request: Any,
    num_new_tokens: int,
    num_new_computed_tokens: int = 0,
    new_computed_blocks: Any | None = None,
    num_lookahead_tokens: int = 0,
    num_external_computed_tokens: int = 0,
    delay_cache_blocks: bool = False,
    num_encoder_tokens: int = 0,
    full_sequence_must_fit: bool = False,
    reserved_blocks: int = 0,
    has_scheduled_reqs: bool = True,
) -> Any | None: ...
def remove_skipped_blocks(
    self: Any, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
) -> None: ...
def coordinator_get_num_blocks_to_allocate(
    self: Any,
    request_id: str,
    num_tokens: int,
    new_computed_blocks: tuple[Any, ...],
    num_encoder_tokens: int,
    total_computed_tokens: int,
    num_local_computed_tokens: int,
    num_tokens_main_model: int,
    apply_admission_cap: bool = False,
    *args: Any,
    **kwargs: Any,
) -> int: ...
