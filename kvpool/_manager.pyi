"""Type stubs of kvpool._manager: vLLM's KVCacheManager hot paths in C."""

from typing import Any

class ManagerPlan:
    @property
    def counts(self) -> dict[str, int]: ...

def plan_for(
    manager: Any,
    *,
    base: type,
    kv_cache_blocks: type,
    request_status: Any,
    full_cls: type,
    sliding_cls: type,
    base_single: type,
    coordinator_classes: tuple[type, ...],
    hybrid_cls: type,
    cap_at_hashed: bool,
    cap_attr: str,
) -> tuple[ManagerPlan, None] | tuple[None, str]: ...
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
