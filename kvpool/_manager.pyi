"""Type stubs of kvpool._manager: vLLM's KVCacheManager hot paths in C."""

from typing import Any

class ManagerPlan:
    @property
    def counts(self) -> dict[str, int]: ...
    @property
    def lookup_compiled(self) -> bool: ...

def plan_for(
    manager: Any,
    *,
    kv_cache_blocks: type,
    request_status: Any,
    full_cls: type,
    sliding_cls: type,
    base_single: type,
    coordinator_classes: tuple[type, ...],
    unitary_cls: type,
    hybrid_cls: type,
    cap_at_hashed: bool,
    trims_null_head: bool,
    has_prefill_end: bool,
    zero_chunk_adopts: bool,
    cap_attr: str,
    pool_cache_full_blocks: Any,
    pool_new_blocks_with_hooks: Any,
    pool_event_extra_keys: Any | None = None,
    common_prefix_blocks: Any | None = None,
    eagle_drop_attr: str = "drop_eagle_group_ids",
    eagle_margin_to_hashes: bool = True,
    rswa_cls: type | None = None,
    chunked_cls: type | None = None,
    cross_cls: type | None = None,
    mamba_cls: type | None = None,
    ring_cls: type | None = None,
    kpool_tail_cls: type | None = None,
    tail_index_cdiv: bool = True,
    tail_eagle_limit: bool = True,
    align_rules: int = 32,
) -> tuple[ManagerPlan, None] | tuple[None, str]: ...
def refresh(self: Any) -> None: ...
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
def cache_blocks(self: Any, request: Any, num_computed_tokens: int) -> None: ...
def get_block_ids(
    self: Any, allow_none: bool = False, *, group_ids: Any | None = None
) -> tuple[list[int], ...] | None: ...
def free(self: Any, request: Any) -> None: ...
def get_blocks(self: Any, request_id: str) -> Any: ...
def get_block_ids_of(self: Any, request_id: str) -> tuple[list[int], ...]: ...
def take_new_block_ids(self: Any) -> list[int]: ...
def get_num_common_prefix_blocks_0_30(self: Any, running_request_id: str) -> list[int]: ...
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
def get_computed_blocks(
    self: Any, request: Any, max_cache_hit_length: int | None = None
) -> tuple[Any, int, int]: ...
def get_computed_blocks_0_30(self: Any, request: Any) -> tuple[Any, int, int]: ...
def get_computed_blocks_0_34(
    self: Any, request: Any, max_cache_hit_length: int | None = None
) -> tuple[Any, int, int]: ...
def estimate_cached_tokens(self: Any, request: Any) -> int: ...
def estimate_cached_tokens_0_34(self: Any, request: Any) -> int: ...
