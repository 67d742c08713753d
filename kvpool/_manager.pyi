"""Type stubs of kvpool._manager: vLLM's KVCacheManager hot paths in C."""

from typing import Any

from kvpool._plan import (
    plan_for as plan_for,
    refresh as refresh,
)
from kvpool._allocate import (
    allocate_slots as allocate_slots,
    allocate_slots_0_30 as allocate_slots_0_30,
    remove_skipped_blocks as remove_skipped_blocks,
    coordinator_get_num_blocks_to_allocate as coordinator_get_num_blocks_to_allocate,
)
from kvpool._caching import (
    cache_blocks as cache_blocks,
)
from kvpool._lookup import (
    get_computed_blocks as get_computed_blocks,
    get_computed_blocks_0_30 as get_computed_blocks_0_30,
    get_computed_blocks_0_34 as get_computed_blocks_0_34,
    estimate_cached_tokens as estimate_cached_tokens,
    estimate_cached_tokens_0_34 as estimate_cached_tokens_0_34,
)

def get_block_ids(
    self: Any, allow_none: bool = False, *, group_ids: Any | None = None
) -> tuple[list[int], ...] | None: ...
def free(self: Any, request: Any) -> None: ...
def get_blocks(self: Any, request_id: str) -> Any: ...
def get_block_ids_of(self: Any, request_id: str) -> tuple[list[int], ...]: ...
def take_new_block_ids(self: Any) -> list[int]: ...
def get_num_common_prefix_blocks_0_30(self: Any, running_request_id: str) -> list[int]: ...
