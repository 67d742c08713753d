# Type stubs of the block-pool core. The compiled ``kvpool._core`` and its
# pure-Python twin ``kvpool._core_py`` implement exactly this interface.
import weakref
from collections.abc import Iterable, Iterator, Mapping, MutableMapping, Sequence
from typing import Any, ClassVar

class KVCacheBlock:
    """Metadata of one KV-cache block (the tensors live on the GPU).

    Standalone, ``KVCacheBlock(3)`` holds its own state; a pool's blocks keep
    theirs in the pool's arrays. Blocks compare and hash by identity.
    """

    def __init__(
        self,
        block_id: int,
        ref_cnt: int = 0,
        _block_hash: bytes | None = None,
        prev_free_block: None = None,
        next_free_block: None = None,
        is_null: bool = False,
    ) -> None: ...
    @property
    def block_id(self) -> int: ...
    ref_cnt: int
    is_null: bool
    @property
    def block_hash(self) -> bytes | None: ...
    @block_hash.setter
    def block_hash(self, block_hash: bytes | None) -> None: ...
    @property
    def _block_hash(self) -> bytes | None: ...
    @_block_hash.setter
    def _block_hash(self, block_hash: bytes | None) -> None:
        """As setting ``block_hash`` (vLLM's connectors write the field)."""
    def reset_hash(self) -> None: ...
    @property
    def prev_free_block(self) -> KVCacheBlock | None: ...
    @property
    def next_free_block(self) -> KVCacheBlock | None: ...

class KVCacheBlock33(KVCacheBlock):
    """A block of the 0.33-style store (vLLM 0.30 and later): plus the
    number of prefix tokens its hash covers and the pool it belongs to."""

    def __init__(
        self,
        block_id: int,
        ref_cnt: int = 0,
        _block_hash: bytes | None = None,
        _block_hash_num_tokens: int | None = None,
        prev_free_block: None = None,
        next_free_block: None = None,
        is_null: bool = False,
        *,
        pool: Any = None,
    ) -> None: ...
    @property
    def block_hash_num_tokens(self) -> int | None: ...
    @property
    def _block_hash_num_tokens(self) -> int | None:
        """As ``block_hash_num_tokens`` (vLLM's field name)."""
    @property
    def pool(self) -> Any: ...
    def set_block_hash(self, block_hash: bytes, num_tokens: int | None = None) -> None: ...

class KVCacheBlock24(KVCacheBlock33):
    """A block of vLLM 0.24-0.29: ``KVCacheBlock33`` without ``pool``
    (reading it raises ``AttributeError``; no ``pool=`` argument)."""

    def __init__(  # type: ignore[override]
        self,
        block_id: int,
        ref_cnt: int = 0,
        _block_hash: bytes | None = None,
        _block_hash_num_tokens: int | None = None,
        prev_free_block: None = None,
        next_free_block: None = None,
        is_null: bool = False,
    ) -> None: ...

class KVCacheBlock34(KVCacheBlock33):
    """A block of vLLM 0.34: plain ``block_hash`` / ``block_hash_num_tokens``
    fields (``_block_hash`` and ``_block_hash_num_tokens`` raise
    ``AttributeError``), and ``pool`` a weak reference to the pool."""

    def __init__(  # type: ignore[override]
        self,
        block_id: int,
        ref_cnt: int = 0,
        block_hash: bytes | None = None,
        block_hash_num_tokens: int | None = None,
        prev_free_block: None = None,
        next_free_block: None = None,
        is_null: bool = False,
        *,
        pool: Any = None,
    ) -> None: ...
    @property
    def block_hash_num_tokens(self) -> int | None: ...
    @block_hash_num_tokens.setter
    def block_hash_num_tokens(self, value: int | None) -> None: ...
    @property
    def pool(self) -> weakref.ref[Any] | None: ...

class FreeKVCacheBlockQueue:
    """Free blocks in eviction order (least recently freed first), as a
    doubly linked list with O(1) removal from the middle."""

    def __init__(self, blocks: list[KVCacheBlock]) -> None: ...
    @property
    def num_free_blocks(self) -> int: ...
    @property
    def fake_free_list_head(self) -> KVCacheBlock: ...
    @property
    def fake_free_list_tail(self) -> KVCacheBlock: ...
    def popleft(self) -> KVCacheBlock: ...
    def popleft_n(self, n: int) -> list[KVCacheBlock]: ...
    def remove(self, block: KVCacheBlock) -> None: ...
    def append(self, block: KVCacheBlock) -> None: ...
    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None: ...
    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put ``blocks`` at the head, in order (0.33)."""
    def iter_blocks_after(self, cursor: KVCacheBlock | None) -> Iterator[KVCacheBlock]:
        """The free blocks after ``cursor`` (None: from the head), lazily."""
    def get_all_free_blocks(self) -> list[KVCacheBlock]: ...

class BlockHashToBlockMap:
    """Prefix-cache index: hash key -> the blocks cached under it, earliest
    inserted first. Keys are never de-duplicated."""

    def __init__(self) -> None: ...
    def get_one_block(self, key: bytes) -> KVCacheBlock | None: ...
    def insert(self, key: bytes, block: KVCacheBlock) -> None: ...
    def pop(self, key: bytes, block_id: int) -> KVCacheBlock | None: ...
    def contain(self, key: bytes, block_id: int) -> bool: ...
    def __len__(self) -> int: ...
    # vLLM's private dict, as a live mapping over the table (its tests
    # evict entries by hand), and what the compiled core builds that
    # mapping on (the pure core's ``_cache`` is a dict).
    @property
    def _cache(self) -> MutableMapping[bytes, Any]: ...
    @_cache.setter
    def _cache(self, entries: Mapping[bytes, Any]) -> None: ...
    def _snapshot_py(self) -> dict[bytes, Any]: ...
    def _entry(self, key: bytes) -> Any: ...
    def _set_entry(self, key: bytes, value: Any) -> None: ...
    def _del_entry(self, key: bytes, must_exist: bool = True) -> None: ...
    def _clear(self) -> None: ...

class BlockHashToBlockMap34(BlockHashToBlockMap):
    """vLLM 0.34's map over a block list: ``_cache`` shows key -> the id of
    the earliest block (a live mapping the GC does not track), ``_dup_ids``
    the ids of keys cached by several blocks; ``clear()`` empties it."""

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None: ...  # type: ignore[override]
    @property
    def _blocks(self) -> Sequence[KVCacheBlock]: ...
    @property
    def _cache(self) -> MutableMapping[bytes, int]: ...  # type: ignore[override]
    @property
    def _dup_ids(self) -> dict[bytes, dict[int, None]]: ...
    def _id_snapshot(self) -> dict[bytes, int]: ...
    def clear(self) -> None: ...

class PoolCore:
    """The block bookkeeping of a ``BlockPool`` (the facade subclasses it).

    ``PoolCore(num_gpu_blocks, *rest)``: the extra arguments are the facade's
    and ignored here. Validates ``num_gpu_blocks`` (int, >= 1).
    """

    # Rules in which vLLM releases differ, read once when a pool is built;
    # a facade overrides them as class attributes (see _core.pyx).
    #: 33: the 0.33-style store and rules (vLLM 0.24 and later); 15: 0.15's.
    _kvpool_line: ClassVar[int]
    #: ``touch``/``free_blocks`` count the null block's ``ref_cnt``, and
    #: another pool's null block is freed by its pool (vLLM before 0.33).
    _kvpool_counts_null: ClassVar[bool]
    #: Where ``free_blocks`` (0.33-style store) puts a block released while
    #: caching is off: "front" (vLLM 0.28+), "back" (0.27.x) or "by_hash"
    #: (0.24-0.26: in front unless it has a hash).
    _kvpool_free_caching_off: ClassVar[str]
    #: 0.33-style store: blocks are ``KVCacheBlock33`` (True, vLLM 0.30+)
    #: or ``KVCacheBlock24`` without ``pool`` (False, vLLM 0.24-0.29).
    _kvpool_block_pool: ClassVar[bool]

    def __init__(self, num_gpu_blocks: int, *args: Any, **kwargs: Any) -> None: ...
    @property
    def num_gpu_blocks(self) -> int: ...
    @property
    def blocks(self) -> list[KVCacheBlock]: ...
    @property
    def free_block_queue(self) -> FreeKVCacheBlockQueue: ...
    @property
    def cached_block_hash_to_block(self) -> BlockHashToBlockMap: ...
    @property
    def null_block(self) -> KVCacheBlock: ...
    def get_cached_block(
        self, block_hash: bytes, kv_cache_group_ids: Sequence[int]
    ) -> list[KVCacheBlock] | None: ...
    def find_longest_cache_hit(
        self,
        block_hashes: Sequence[bytes],
        kv_cache_group_ids: Sequence[int],
        max_blocks: int | None = None,
    ) -> list[list[KVCacheBlock]]: ...
    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None: ...
    def _free_blocks34(
        self, ordered_blocks: Iterable[KVCacheBlock], evict_first: bool = False
    ) -> None:
        """vLLM 0.34's ``free_blocks`` (the 0.34 facade binds it under that name)."""
    # Set by the facade; get_new_blocks and touch call the facade's
    # _get_new_blocks_with_hooks / _report_touch when events or metrics are on.
    hash_block_size: Any
    enable_caching: Any
    def cache_full_blocks(
        self,
        request: Any,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
    ) -> None: ...
    enable_kv_cache_events: Any
    metrics_collector: Any
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]: ...
    def touch(self, blocks: Sequence[KVCacheBlock]) -> None: ...
    def get_num_free_blocks(self) -> int: ...
    def get_usage(self) -> float: ...
    @property
    def cached_block_hashes_by_block(self) -> dict[int, set[bytes]]:
        """0.33: the keys a block is cached under besides its hash."""
    # Internal, for the facade.
    @property
    def _reuse_watchers(self) -> dict[int, Any]: ...
    def _allocate(
        self, num_blocks: int, evict: bool, removed: list[bytes] | None
    ) -> list[KVCacheBlock]: ...
    def _evict_block(self, block: KVCacheBlock, removed: list[bytes] | None) -> bool: ...
    def _evict_block_ids(self, block_ids: list[int], removed: list[bytes] | None) -> None: ...
    def _touch(self, blocks: Sequence[KVCacheBlock]) -> None: ...
    def _cache_blocks(
        self,
        blocks: Sequence[KVCacheBlock],
        start: int,
        stop: int,
        block_hashes: Sequence[bytes],
        group_id: int,
        stored: list[bytes] | None,
    ) -> None: ...
    def _cache_blocks33(
        self,
        blocks: Sequence[KVCacheBlock],
        start: int,
        stop: int,
        block_hashes: Sequence[bytes],
        scale: int,
        group_id: int,
        block_size: int,
        block_mask: Any,
        removed: list[bytes] | None,
        stored: list[bytes] | None,
    ) -> None: ...
    def _claim(self, blocks: Sequence[KVCacheBlock], evict: bool, removed: list[bytes] | None) -> None: ...
    def _unpin(self, blocks: Sequence[KVCacheBlock]) -> Sequence[KVCacheBlock]: ...
    def _removed_events(
        self, cls: type, keys: list[bytes], medium: Any, with_group: bool, use_int: bool
    ) -> list[Any]: ...
    def _reset_cache(self) -> bool: ...
    def _clear_map(self) -> None: ...
    def _reset_hashes(self) -> None: ...
