"""Type stubs of kvpool._plan: The plan of kvpool's KV-cache manager (see kvpool/_plan.pyx)."""

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
