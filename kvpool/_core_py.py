"""Pure-Python twin of the compiled core ``kvpool._core``.

It keeps vLLM 0.15.1's design, so it doubles as the "pure-Python pool"
baseline the benchmarks compare against: every block is a Python object, the
free queue is a doubly linked list threaded through the blocks themselves, and
the prefix cache is a dict from hash key to a block (or to a small dict of
blocks). What it adds is the behaviour of ``docs/core-contract.md``: misuse
raises instead of asserting, and a call that raises has changed nothing.

Being the baseline, it must not be a strawman, so the checks are arranged to
cost (almost) nothing per block:

- The public attributes of ``KVCacheBlock`` are properties (the contract makes
  ``block_id`` and the neighbours read-only and validates ``ref_cnt``), but
  the queue's and the pool's loops use the plain attributes behind them
  (``_ref_cnt``, ``_prev``, ...).
- Ownership is an identity test: the blocks a queue owns have
  ``_owner is queue._tok``; a standalone block has ``_owner is None`` and a
  sentinel ``_owner is _SENTINEL``. A non-block fails the same test (or has no
  ``_owner``, an ``AttributeError`` the fast paths catch), so they need no
  ``isinstance``.
- An owned block out of the queue has ``_prev is queue._tok`` (not None; the
  ``prev_free_block`` property hides this), so "owned by this queue and not
  in it", what ``append`` requires, is a single test.
- Checking passes only *detect* a problem; a slow scan over the untouched
  arguments (the ``_raise_*`` helpers) then finds the first culprit and
  raises the precise exception. Where detection marks blocks (to catch a
  block passed twice without building a set), the marks are undone first.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from itertools import islice
from weakref import ref as _weakref
from typing import Any

from ._rules import FREE_CACHING_OFF as _FREE_CACHING_OFF
from ._rules import free_caching_off_rule as _free_caching_off_rule

__all__ = [
    "KVCacheBlock",
    "KVCacheBlock33",
    "KVCacheBlock24",
    "KVCacheBlock34",
    "BlockHashToBlockMap34",
    "FreeKVCacheBlockQueue",
    "BlockHashToBlockMap",
    "PoolCore",
]

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1
# Lowest ref_cnt of a null block whose count is kept (_kvpool_counts_null),
# as the compiled core's int32 allows.
_NULL_REF_CNT_MIN = -_INT32_MAX
# Two ids stay free for the compiled core's sentinels.
_MAX_GPU_BLOCKS = 2**31 - 3
_GROUP_ID_BYTES = 4  # as kvpool.hashing.GROUP_ID_BYTES

# ``_owner`` of the head/tail sentinels: no queue's token, so ``remove`` and
# ``append`` reject them and no queue adopts them.
_SENTINEL = object()


def _check_block_id(block_id: Any) -> int:
    if isinstance(block_id, bool) or not isinstance(block_id, int):
        raise TypeError(f"block_id must be an int, got {type(block_id).__name__}")
    if not _INT32_MIN <= block_id <= _INT32_MAX:
        raise ValueError(f"block_id must be in [{_INT32_MIN}, {_INT32_MAX}], got {block_id}")
    return int(block_id)


def _check_ref_cnt(ref_cnt: Any, null: bool = False) -> int:
    """A ref_cnt a block may be given; the null block's may be below 0, as
    vLLM before 0.33 drives it (down to _NULL_REF_CNT_MIN)."""
    low = _NULL_REF_CNT_MIN if null else 0
    if isinstance(ref_cnt, bool) or not isinstance(ref_cnt, int):
        raise TypeError(f"ref_cnt must be an int, got {type(ref_cnt).__name__}")
    if not low <= ref_cnt <= _INT32_MAX:
        raise ValueError(f"ref_cnt must be in [{low}, {_INT32_MAX}], got {ref_cnt}")
    return int(ref_cnt)


def _check_hash(value: Any, what: str) -> None:
    if not isinstance(value, bytes):
        raise TypeError(f"{what} must be bytes, got {type(value).__name__}")


def _group_suffix(group_id: Any) -> bytes:
    """The 4-byte big-endian suffix ``group_id`` adds to a hash key."""
    if not isinstance(group_id, int):
        raise TypeError(f"kv_cache_group_id must be an int, got {type(group_id).__name__}")
    # OverflowError outside [0, 2**32), as int.to_bytes raises it.
    return group_id.to_bytes(_GROUP_ID_BYTES, "big")


def _check_out_list(value: Any, name: str) -> None:
    # These lists are appended to mid-mutation: a bad one must fail up front.
    if value is not None and type(value) is not list:
        raise TypeError(f"{name} must be a list or None, got {type(value).__name__}")


def _check_owned(block: Any, tok: object, what: str, adopter: Any = None) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``block`` is owned by ``tok``:
    the slow path taken once a fast ``_owner is tok`` test has failed. With
    ``adopter`` (the queue of ``tok``), a stand-alone block is adopted instead."""
    if adopter is not None and adopter._adopt_one(block):
        return
    if not isinstance(block, KVCacheBlock):
        raise TypeError(f"{what}: expected a KVCacheBlock, got {type(block).__name__}")
    if block._owner is _SENTINEL:
        raise ValueError(f"{what}: block {block._block_id} is a free-queue sentinel")
    if block._owner is not tok:
        raise ValueError(f"{what}: block {block._block_id} does not belong to this pool/queue")


class KVCacheBlock:
    """Metadata of one KV-cache block (the tensors live on the GPU).

    A plain class, not slotted, so that a block costs what vLLM's dataclass
    costs. The public attributes are properties over underscored ones, which
    the queue and the pool use directly. Blocks compare and hash by identity.
    """

    def __init__(
        self,
        block_id: int,
        ref_cnt: int = 0,
        _block_hash: bytes | None = None,
        prev_free_block: None = None,
        next_free_block: None = None,
        is_null: bool = False,
    ) -> None:
        block_id = _check_block_id(block_id)
        if prev_free_block is not None or next_free_block is not None:
            raise ValueError(
                "prev_free_block and next_free_block must be None: only a "
                "FreeKVCacheBlockQueue links blocks"
            )
        ref_cnt = _check_ref_cnt(ref_cnt)
        if _block_hash is not None:
            _check_hash(_block_hash, "_block_hash")
        # FreeKVCacheBlockQueue._for_pool sets the same attributes in the same
        # order, so that all blocks share one key layout (and its memory).
        self._block_id = block_id
        self._ref_cnt = ref_cnt
        self._hash = _block_hash
        self._prev: Any = None
        self._next: KVCacheBlock | None = None
        self._is_null = bool(is_null)
        self._owner: object | None = None
        self._ntok: int | None = None
        self._pool: Any = None

    @property
    def block_id(self) -> int:
        return self._block_id

    @property
    def ref_cnt(self) -> int:
        return self._ref_cnt

    @ref_cnt.setter
    def ref_cnt(self, value: int) -> None:
        # Only the count changes: the block does not enter or leave a queue.
        self._ref_cnt = _check_ref_cnt(value, self._is_null)

    @property
    def is_null(self) -> bool:
        return self._is_null

    @is_null.setter
    def is_null(self, value: bool) -> None:
        self._is_null = bool(value)

    @property
    def block_hash(self) -> bytes | None:
        return self._hash

    @block_hash.setter
    def block_hash(self, block_hash: bytes | None) -> None:
        if block_hash is not None:
            _check_hash(block_hash, "block_hash")
        if self._hash is not None:
            raise RuntimeError(
                f"block {self._block_id} already has a hash ({self._hash!r}); "
                "reset_hash() first"
            )
        self._hash = block_hash

    @property
    def _block_hash(self) -> bytes | None:
        return self._hash

    @_block_hash.setter
    def _block_hash(self, block_hash: bytes | None) -> None:
        # vLLM's connectors write the field directly (SimpleCPUOffload, from
        # 0.19, on a block fresh from get_new_blocks): the setter's rules.
        self.block_hash = block_hash

    def reset_hash(self) -> None:
        """Forget the hash key (the block was evicted from the prefix cache)."""
        self._hash = None
        self._ntok = None

    @property
    def prev_free_block(self) -> KVCacheBlock | None:
        prev = self._prev
        # An owned block out of its queue holds the queue's token here.
        return None if prev is self._owner else prev

    @property
    def next_free_block(self) -> KVCacheBlock | None:
        return self._next

    def __reduce__(self) -> Any:
        # A copy of a pool's block would carry the pool's token and pass for
        # one of its blocks. Refused for every block, as in the compiled core.
        raise TypeError("KVCacheBlock cannot be copied or pickled")

    def __repr__(self) -> str:
        return self._repr("")

    def _repr(self, extra: str, hash_field: str = "_block_hash") -> str:
        """Every line's repr: neighbours by id only (printing them whole
        would recurse along the list); ``extra``: the 0.33 line's token-count
        field; ``hash_field``: the hash's field name (0.34: ``block_hash``)."""
        prev, next_ = self.prev_free_block, self._next
        return (
            f"KVCacheBlock(block_id={self._block_id}, "
            f"ref_cnt={self._ref_cnt}, "
            f"{hash_field}={self._hash!r}, "
            f"{extra}"
            f"prev_free_block={None if prev is None else prev._block_id}, "
            f"next_free_block={None if next_ is None else next_._block_id})"
        )


def _check_ntok(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"num_tokens must be an int or None, got {type(value).__name__}")
    if not -(2**63) < value < 2**63:
        raise OverflowError(f"num_tokens {value} does not fit in 64 bits")
    return int(value)


class KVCacheBlock33(KVCacheBlock):
    """A block of the vLLM 0.33 line: ``KVCacheBlock`` plus the number of
    prefix tokens its hash covers, its pool, ``set_block_hash`` and 0.33's
    constructor and ``repr`` (as the compiled core's subclass)."""

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
    ) -> None:
        ntok = _check_ntok(_block_hash_num_tokens)
        super().__init__(block_id, ref_cnt, _block_hash, prev_free_block, next_free_block, is_null)
        self._ntok = ntok
        self._pool = pool

    @property
    def block_hash_num_tokens(self) -> int | None:
        return self._ntok

    @property
    def _block_hash_num_tokens(self) -> int | None:
        return self._ntok

    @property
    def pool(self) -> Any:
        return self._pool

    def set_block_hash(self, block_hash: bytes, num_tokens: int | None = None) -> None:
        """Give the block its (first) hash key and the number of prefix tokens
        it covers; the block must have none yet."""
        _check_hash(block_hash, "block_hash")
        ntok = _check_ntok(num_tokens)
        if self._hash is not None or self._ntok is not None:
            raise RuntimeError(
                f"block {self._block_id} already has a hash; reset_hash() it first"
            )
        self._hash = block_hash
        self._ntok = ntok

    def __repr__(self) -> str:
        return self._repr(f"_block_hash_num_tokens={self._ntok}, ")


class KVCacheBlock24(KVCacheBlock33):
    """A block of vLLM 0.24-0.29: ``KVCacheBlock33`` without ``pool`` (the
    field and the constructor argument came in 0.30). The core still knows
    a block's pool (``_pool``, for cross-pool frees); it is just not shown."""

    def __init__(
        self,
        block_id: int,
        ref_cnt: int = 0,
        _block_hash: bytes | None = None,
        _block_hash_num_tokens: int | None = None,
        prev_free_block: None = None,
        next_free_block: None = None,
        is_null: bool = False,
    ) -> None:
        super().__init__(
            block_id, ref_cnt, _block_hash, _block_hash_num_tokens, prev_free_block,
            next_free_block, is_null,
        )

    @property
    def pool(self) -> Any:
        raise AttributeError("'KVCacheBlock' object has no attribute 'pool'")


class KVCacheBlock34(KVCacheBlock33):
    """A block of vLLM 0.34: plain ``block_hash`` / ``block_hash_num_tokens``
    fields (no ``_block_hash``) and ``pool`` a weak reference to its pool
    (as the compiled core's subclass)."""

    def __init__(
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
    ) -> None:
        if isinstance(pool, _weakref):
            pool = pool()
        super().__init__(
            block_id, ref_cnt, block_hash, block_hash_num_tokens, prev_free_block,
            next_free_block, is_null, pool=pool,
        )

    @property
    def block_hash_num_tokens(self) -> int | None:
        return self._ntok

    @block_hash_num_tokens.setter
    def block_hash_num_tokens(self, value: int | None) -> None:
        self._ntok = _check_ntok(value)

    @property
    def _block_hash(self) -> Any:
        raise AttributeError("'KVCacheBlock' object has no attribute '_block_hash'")

    @property
    def _block_hash_num_tokens(self) -> Any:
        raise AttributeError("'KVCacheBlock' object has no attribute '_block_hash_num_tokens'")

    @property
    def pool(self) -> Any:
        return None if self._pool is None else _weakref(self._pool)

    def __repr__(self) -> str:
        return self._repr(f"block_hash_num_tokens={self._ntok}, ", "block_hash")


def _make_sentinel(cls: type = KVCacheBlock) -> KVCacheBlock:
    block = cls(-1)
    block._owner = _SENTINEL
    return block


class FreeKVCacheBlockQueue:
    """Free blocks in eviction order (least recently freed first).

    A doubly linked list through the blocks' own ``_prev``/``_next`` rather
    than a ``collections.deque``: a prefix-cache hit takes a block out of the
    *middle* of the queue, which must be O(1), and relinking allocates no
    Python object. Head and tail sentinels (``block_id == -1``) spare the
    empty-list branches.

    The queue adopts the blocks it is given for good: their ``_owner``
    becomes its token, which is how it tells its blocks from any other.
    """

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        if hasattr(self, "_head"):
            raise RuntimeError("FreeKVCacheBlockQueue is already initialised")
        blocks = list(blocks)
        seen: set[int] = set()
        cls = type(blocks[0]) if blocks else KVCacheBlock
        for block in blocks:
            if not isinstance(block, KVCacheBlock):
                raise TypeError(
                    f"FreeKVCacheBlockQueue: expected KVCacheBlocks, got {type(block).__name__}"
                )
            if type(block) is not cls:
                raise TypeError("blocks of different vLLM lines cannot share a queue")
            if block._owner is not None:
                kind = "a free-queue sentinel" if block._owner is _SENTINEL else "already owned"
                raise ValueError(f"FreeKVCacheBlockQueue: block {block._block_id} is {kind}")
            if id(block) in seen:
                raise ValueError(f"FreeKVCacheBlockQueue: block {block._block_id} given twice")
            seen.add(id(block))
        tok = self._init_empty(cls)
        # Built from an empty list, the queue takes the vLLM line of the
        # first block it adopts (_adopt_one), as the compiled core does.
        self._unsettled = not blocks
        last = self._head
        for block in blocks:
            block._owner = tok
            block._prev = last
            last._next = block
            last = block
        self._close(last, len(blocks))

    @classmethod
    def _for_pool(
        cls, num_blocks: int, block_cls: type = KVCacheBlock, pool: Any = None
    ) -> tuple[FreeKVCacheBlockQueue, list[KVCacheBlock]]:
        """A queue of new blocks ``0..num_blocks-1`` (of ``block_cls``, whose
        ``pool`` is ``pool``), made and linked in one walk without the
        constructor's checks (they cannot fail here)."""
        self = cls.__new__(cls)
        tok = self._init_empty(block_cls)
        new = object.__new__
        blocks = []
        last = self._head
        for block_id in range(num_blocks):
            block = new(block_cls)
            block._block_id = block_id
            block._ref_cnt = 0
            block._hash = None
            block._prev = last
            block._next = None
            block._is_null = False
            block._owner = tok
            block._ntok = None
            block._pool = pool
            last._next = block
            last = block
            blocks.append(block)
        self._close(last, num_blocks)
        return self, blocks

    def _init_empty(self, block_cls: type = KVCacheBlock) -> object:
        self._tok = tok = object()
        self._head = _make_sentinel(block_cls)
        self._tail = _make_sentinel(block_cls)
        return tok

    def _settle_kind(self, block_cls: type) -> None:
        """New sentinels of ``block_cls`` for an empty queue (see _adopt_one)."""
        head, tail = _make_sentinel(block_cls), _make_sentinel(block_cls)
        head._next, tail._prev = tail, head
        self._head, self._tail = head, tail

    def _close(self, last: KVCacheBlock, num_blocks: int) -> None:
        tail = self._tail
        last._next = tail
        tail._prev = last
        self._num_free = num_blocks

    def _adopt_one(self, block: Any) -> bool:
        """Take a stand-alone block (made with ``KVCacheBlock(...)``, in no
        pool or queue) as one of this queue's, out of the list: vLLM lets any
        block join any pool or queue; adopting keeps each block in one, so it
        can never be linked into two lists. False if it is not one."""
        if not isinstance(block, KVCacheBlock) or block._owner is not None:
            return False
        if getattr(self, "_unsettled", False):
            self._unsettled = False
            if self._num_free == 0 and self._head._next is self._tail:
                self._settle_kind(type(block))
        if type(block) is not type(self._head):
            raise TypeError(
                f"block {block._block_id} is of the other vLLM line than this pool or queue"
            )
        block._owner = self._tok
        block._prev = self._tok
        block._next = None
        return True

    def _adopt(self, blocks: Iterable[Any]) -> bool:
        """``_adopt_one`` over ``blocks``; whether any was adopted."""
        adopted = False
        for block in blocks:
            if self._adopt_one(block):
                adopted = True
        return adopted

    @property
    def num_free_blocks(self) -> int:
        return self._num_free

    @property
    def fake_free_list_head(self) -> KVCacheBlock:
        return self._head

    @property
    def fake_free_list_tail(self) -> KVCacheBlock:
        return self._tail

    def popleft(self) -> KVCacheBlock:
        """Take the least recently freed block."""
        head = self._head
        block = head._next
        if block is self._tail:
            raise ValueError("No free blocks available")
        nxt = block._next
        head._next = nxt
        nxt._prev = head
        block._prev = self._tok
        block._next = None
        self._num_free -= 1
        return block

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Take the ``n`` least recently freed blocks, in queue order."""
        if not isinstance(n, int):
            raise TypeError(f"n must be an int, got {type(n).__name__}")
        num_free = self._num_free
        if n < 0 or n > num_free:
            raise ValueError(f"Cannot pop {n} blocks from a queue of {num_free} free blocks")
        if n == 0:
            return []
        tok = self._tok
        head = self._head
        block = head._next
        ret = []
        for _ in range(n):
            ret.append(block)
            last = block
            block = block._next
            last._prev = tok
            last._next = None
        head._next = block
        block._prev = head
        self._num_free = num_free - n
        return ret

    def remove(self, block: KVCacheBlock) -> None:
        """Take ``block`` out of the middle of the queue in O(1)."""
        tok = self._tok
        try:
            prev = block._prev
            ok = block._owner is tok and prev is not tok
        except AttributeError:  # not a block: reported below
            ok = False
        if not ok:
            _check_owned(block, tok, "remove()", self)
            raise RuntimeError(f"remove(): block {block._block_id} is not in the free queue")
        nxt = block._next
        prev._next = nxt
        nxt._prev = prev
        block._prev = tok
        block._next = None
        self._num_free -= 1

    def append(self, block: KVCacheBlock) -> None:
        """Put ``block`` at the tail (evicted last)."""
        try:
            ok = block._prev is self._tok
        except AttributeError:  # not a block: reported below
            ok = False
        if not ok:
            if self._adopt_one(block):
                return self.append(block)
            self._raise_bad_append([block], "append()")
        tail = self._tail
        last = tail._prev
        last._next = block
        block._prev = last
        block._next = tail
        tail._prev = block
        self._num_free += 1

    def append_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put ``blocks`` at the tail, in order."""
        self._link_n(blocks, False, "append_n()")

    def prepend_n(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Put ``blocks`` at the head, in order: ``blocks[0]`` is evicted
        first (vLLM 0.33 frees blocks that cannot be a prefix hit this way)."""
        self._link_n(blocks, True, "prepend_n()")

    def iter_blocks_after(self, cursor: KVCacheBlock | None) -> Iterator[KVCacheBlock]:
        """The free blocks after ``cursor`` (a block of this queue or a
        sentinel; None: from the head), in eviction order. Lazy: each step
        follows the cursor's link as it is then; a cursor that is no longer
        queued ends the walk."""
        if cursor is None:
            cursor = self._head
        elif cursor is not self._head and cursor is not self._tail:
            _check_owned(cursor, self._tok, "iter_blocks_after()", self)
        return self._iter_after(cursor)

    def _iter_after(self, cursor: KVCacheBlock) -> Iterator[KVCacheBlock]:
        tail = self._tail
        block = cursor._next
        while block is not None and block is not tail:
            yield block
            block = block._next

    def _link_n(self, blocks: Sequence[KVCacheBlock], front: bool, what: str) -> None:
        if type(blocks) is not list:
            blocks = list(blocks)
        if not blocks:
            return
        tok = self._tok
        # Link after `old_last` (the head, or the last block), before `after`.
        old_last = last = self._head if front else self._tail._prev
        tail = after = old_last._next
        # Check while linking: a block linked earlier in this call no longer
        # has _prev is tok, so a repeat fails like a block already queued.
        done = False
        try:
            for block in blocks:
                if block._prev is not tok:
                    break
                block._prev = last
                last._next = block
                last = block
            else:
                done = True
        except AttributeError:  # not a block: reported below
            pass
        finally:
            if not done:
                # Unlink what this call linked: the chain ends at a _next of None.
                block = old_last._next
                while block is not tail and block is not None:
                    nxt = block._next
                    block._prev = tok
                    block._next = None
                    block = nxt
                old_last._next = after
        if not done:
            if self._adopt(blocks):
                return self._link_n(blocks, front, what)
            self._raise_bad_append(blocks, what)
        last._next = after
        after._prev = last
        self._num_free += len(blocks)

    def _raise_bad_append(self, blocks: list[Any], what: str) -> None:
        tok = self._tok
        seen: set[int] = set()
        for block in blocks:
            _check_owned(block, tok, what)
            if block._prev is not tok:
                raise ValueError(f"{what}: block {block._block_id} is already in the free queue")
            if id(block) in seen:
                raise ValueError(f"{what}: block {block._block_id} given twice")
            seen.add(id(block))
        raise AssertionError(f"{what}: no bad block found")  # pragma: no cover

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """The free blocks from head (evicted first) to tail."""
        ret = []
        tail = self._tail
        block = self._head._next
        while block is not tail:
            ret.append(block)
            block = block._next
        return ret


class BlockHashToBlockMap:
    """Prefix-cache index: hash key -> the blocks cached under it.

    A key maps straight to its block, and to a ``{block_id: block}`` dict only
    once a second block is cached under it: almost every key has one block,
    and an inner dict per key would give the GC millions more containers to
    walk. Keys are never de-duplicated, so that a block id handed to a
    request never changes (block tables are append-only); lookups return the
    earliest inserted block.
    """

    def __init__(self) -> None:
        self._table: dict[bytes, KVCacheBlock | dict[int, KVCacheBlock]] = {}

    @property
    def _cache(self) -> dict[bytes, Any]:
        """vLLM's private dict (0.15-0.33): the table itself."""
        return self._table

    @_cache.setter
    def _cache(self, entries: dict[bytes, Any]) -> None:
        self._table = entries

    def get_one_block(self, key: bytes) -> KVCacheBlock | None:
        """The earliest-inserted block cached under ``key``, or None."""
        _check_hash(key, "key")
        entry = self._table.get(key)
        if entry.__class__ is dict:
            return next(iter(entry.values()))
        return entry

    def insert(self, key: bytes, block: KVCacheBlock) -> None:
        """Cache ``block`` under ``key``, after the blocks already there."""
        _check_hash(key, "key")
        if not isinstance(block, KVCacheBlock):
            raise TypeError(f"block must be a KVCacheBlock, got {type(block).__name__}")
        self._insert(key, block)

    def _insert(self, key: bytes, block: KVCacheBlock) -> None:
        cache = self._table
        entry = cache.get(key)
        if entry is None:
            cache[key] = block
        elif entry.__class__ is dict:
            entry[block._block_id] = block
        else:
            cache[key] = {entry._block_id: entry, block._block_id: block}

    def contain(self, key: bytes, block_id: int) -> bool:
        """Whether the block ``block_id`` is cached under ``key``."""
        _check_hash(key, "key")
        entry = self._table.get(key)
        if entry is None:
            return False
        if entry.__class__ is dict:
            return block_id in entry
        return entry._block_id == block_id

    def pop(self, key: bytes, block_id: int) -> KVCacheBlock | None:
        """Remove and return block ``block_id`` cached under ``key``; None,
        and no change, if it is not there."""
        _check_hash(key, "key")
        return self._pop(key, block_id)

    def _pop(self, key: bytes, block_id: int) -> KVCacheBlock | None:
        cache = self._table
        entry = cache.get(key)
        if entry is None:
            return None
        if entry.__class__ is dict:
            block = entry.pop(block_id, None)
            if not entry:
                del cache[key]
            return block
        if entry._block_id == block_id:
            del cache[key]
            return entry
        return None

    def __len__(self) -> int:
        return len(self._table)


class BlockHashToBlockMap34(BlockHashToBlockMap):
    """vLLM 0.34's ``BlockHashToBlockMap(blocks)``: the same table, shown as
    0.34 shows it -- ``_cache`` maps a key to the id of its earliest block,
    ``_dup_ids`` lists the ids of keys cached by several blocks, ``clear()``
    empties it in place (as the compiled core's subclass). A block given to
    ``insert`` must be the one at its id in ``blocks``."""

    def __init__(self, blocks: Sequence[KVCacheBlock]) -> None:
        super().__init__()
        self._blocks = blocks

    def insert(self, key: bytes, block: KVCacheBlock) -> None:
        """Cache ``block`` under ``key``, after the blocks already there."""
        _check_hash(key, "key")
        if not isinstance(block, KVCacheBlock):
            raise TypeError(f"block must be a KVCacheBlock, got {type(block).__name__}")
        try:
            known = self._block_of(block._block_id)
        except IndexError:
            known = None
        if known is not block:
            raise ValueError(
                f"block {block._block_id} is not the block of that id in the list "
                "this map was built over"
            )
        self._insert(key, block)

    def _block_of(self, block_id: int) -> KVCacheBlock:
        """The block ``block_id`` names: ``TypeError`` for a non-int,
        ``IndexError`` outside ``[0, len(blocks))`` (a negative id names no
        block, whatever the list's indexing would give)."""
        if isinstance(block_id, bool) or not isinstance(block_id, int):
            raise TypeError(f"a block id must be an int, got {type(block_id).__name__}")
        blocks = self._blocks
        if not 0 <= block_id < len(blocks):
            raise IndexError(f"block id {block_id} is out of range [0, {len(blocks)})")
        return blocks[block_id]

    @property
    def _cache(self) -> _IdCacheView:
        """vLLM 0.34's private dict, live: key -> id of the earliest block."""
        return _IdCacheView(self)

    @property
    def _dup_ids(self) -> dict[bytes, dict[int, None]]:
        """A snapshot of vLLM 0.34's ``_dup_ids``."""
        return {
            key: dict.fromkeys(entry)
            for key, entry in self._table.items()
            if entry.__class__ is dict and len(entry) > 1
        }

    def _id_snapshot(self) -> dict[bytes, int]:
        return {
            key: next(iter(entry)) if entry.__class__ is dict else entry._block_id
            for key, entry in self._table.items()
        }

    def clear(self) -> None:
        """Forget every key (in place)."""
        self._table.clear()


class _IdCacheView(MutableMapping):
    """``BlockHashToBlockMap34._cache``: see that property."""

    __slots__ = ("_map",)

    def __init__(self, hash_map: BlockHashToBlockMap34) -> None:
        self._map = hash_map

    def __getitem__(self, key: bytes) -> int:
        entry = self._map._table[key]
        return next(iter(entry)) if entry.__class__ is dict else entry._block_id

    def __setitem__(self, key: bytes, block_id: int) -> None:
        _check_hash(key, "key")
        self._map._table[key] = self._map._block_of(block_id)

    def __delitem__(self, key: bytes) -> None:
        del self._map._table[key]

    def __iter__(self) -> Iterator[bytes]:
        return iter(list(self._map._table))

    def __len__(self) -> int:
        return len(self._map._table)

    def copy(self) -> dict[bytes, int]:
        return self._map._id_snapshot()

    __copy__ = copy

    def __eq__(self, other: object) -> bool:
        if isinstance(other, _IdCacheView):
            other = other.copy()
        return self._map._id_snapshot() == other

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._map._id_snapshot())


class PoolCore:
    """The block bookkeeping of a ``BlockPool`` (the facade subclasses it).

    Everything is built in ``__new__``, as the compiled core does in
    ``__cinit__``, so the facade's ``__init__`` needs no ``super()`` call; the
    other constructor arguments are the facade's and ignored here.
    """

    # Rules in which vLLM releases differ, one class attribute each: a
    # facade overrides the ones its release needs. They are read once, when
    # a pool is built (changing them later has no effect). The compiled
    # core's PoolCore has the same names and defaults.

    #: 33: the 0.33-style store (several keys per block, partial entries,
    #: token counts, ``block.pool``) and 0.33's free order, eviction and
    #: cross-pool frees (the lines of vLLM 0.24 and later); 15: vLLM 0.15's.
    _kvpool_line = 15
    #: True: ``touch`` adds one to the null block's ``ref_cnt`` and
    #: ``free_blocks`` takes one (it may go below 0; it is never checked or
    #: queued), and on the 0.33-style store another pool's null block is
    #: handed to its pool like its other blocks -- as vLLM does before 0.33.
    #: False: the null block is skipped (vLLM 0.33).
    _kvpool_counts_null = False
    #: Where the 0.33-style ``free_blocks`` puts a block released while
    #: caching is off: "front" (vLLM 0.28 and later: LIFO reuse, for GPU
    #: locality), "back" (0.27.x) or "by_hash" (0.24-0.26: caching is not
    #: looked at; in front unless the block has a hash). With caching on,
    #: a block goes in front iff it has no hash, in every line.
    _kvpool_free_caching_off = "front"
    #: With the 0.33-style store: True, blocks show their pool (``pool``
    #: field and argument, vLLM 0.30 and later: ``KVCacheBlock33``); False,
    #: they do not (vLLM 0.24-0.29: ``KVCacheBlock24``); ``"weak"``, as a
    #: weak reference, with 0.34's block fields and its map over block ids
    #: (vLLM 0.34: ``KVCacheBlock34``, ``BlockHashToBlockMap34``).
    _kvpool_block_pool = True

    def __new__(cls, num_gpu_blocks: int, *args: Any, **kwargs: Any) -> PoolCore:
        if isinstance(num_gpu_blocks, bool) or not isinstance(num_gpu_blocks, int):
            raise TypeError(f"num_gpu_blocks must be an int, got {type(num_gpu_blocks).__name__}")
        if not 1 <= num_gpu_blocks <= _MAX_GPU_BLOCKS:
            raise ValueError(
                f"num_gpu_blocks must be in [1, {_MAX_GPU_BLOCKS}], got {num_gpu_blocks}"
            )
        self = super().__new__(cls)
        num_gpu_blocks = int(num_gpu_blocks)
        v33 = cls._kvpool_line == 33
        if v33:
            # As vLLM 0.33, every block refers to its pool (a cycle the GC
            # collects; the compiled core keeps this reference borrowed).
            block_cls = KVCacheBlock33 if cls._kvpool_block_pool else KVCacheBlock24
            if cls._kvpool_block_pool == "weak":
                block_cls = KVCacheBlock34
            queue, blocks = FreeKVCacheBlockQueue._for_pool(num_gpu_blocks, block_cls, self)
        else:
            queue, blocks = FreeKVCacheBlockQueue._for_pool(num_gpu_blocks)
        self._v33 = v33
        self._count_null = bool(cls._kvpool_counts_null)
        self._free_off = _free_caching_off_rule(cls)
        self.cached_block_hashes_by_block: dict[int, set[bytes]] = {}
        self._reuse_watchers: dict[int, Any] = {}
        null_block = queue.popleft()
        null_block._is_null = True
        self._num_gpu_blocks = num_gpu_blocks
        # No private copy (it would cost 8 bytes a block and GC time over
        # vLLM's pool); the two users of this list check it instead.
        self._blocks = blocks
        self._queue = queue
        self._tok = queue._tok
        self._v34 = v33 and cls._kvpool_block_pool == "weak"
        self._map = BlockHashToBlockMap34(blocks) if self._v34 else BlockHashToBlockMap()
        self._null_block = null_block
        return self

    def __init__(self, num_gpu_blocks: int, *args: Any, **kwargs: Any) -> None:
        pass

    @property
    def num_gpu_blocks(self) -> int:
        return self._num_gpu_blocks

    @property
    def blocks(self) -> list[KVCacheBlock]:
        return self._blocks

    @property
    def free_block_queue(self) -> FreeKVCacheBlockQueue:
        return self._queue

    @property
    def cached_block_hash_to_block(self) -> BlockHashToBlockMap:
        return self._map

    @property
    def null_block(self) -> KVCacheBlock:
        return self._null_block

    # -- prefix-cache lookups (read only) -------------------------------------

    # The facade's settings; plain attributes here (the compiled core keeps
    # them in C fields). The facade's __init__ sets them.
    hash_block_size: Any = None
    enable_caching: Any = False
    enable_kv_cache_events: Any = False
    metrics_collector: Any = None

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` blocks from the head of the free queue (least
        recently freed first), evicting their cached hashes when caching is
        on, each with ``ref_cnt == 1``. Does not look in the cache."""
        if self.enable_kv_cache_events or self.metrics_collector or self._reuse_watchers:
            return self._get_new_blocks_with_hooks(num_blocks)
        return self._allocate(num_blocks, self.enable_caching, None)

    def _removed_events(
        self, cls: Any, keys: list[bytes], medium: Any, with_group: bool, use_int: bool
    ) -> list[Any]:
        """The facades' ``BlockRemoved`` events for evicted ``keys``, in
        order (see the compiled core's docstring): per key its block hash,
        converted as kvpool.hashing.convert_block_hashes does, and with
        ``with_group`` its group id. Every key must be bytes."""
        if type(keys) is not list:
            raise TypeError(f"keys must be a list, got {type(keys).__name__}")
        for key in keys:
            if not isinstance(key, bytes):
                raise TypeError(f"an evicted key must be bytes, got {type(key).__name__}")
        out = []
        for key in keys:
            h: Any = key[:-_GROUP_ID_BYTES]
            if use_int:
                h = int.from_bytes(h[-8:], "big")
            if with_group:
                group = int.from_bytes(key[-_GROUP_ID_BYTES:], "big")
                out.append(cls(block_hashes=[h], medium=medium, group_idx=group))
            else:
                out.append(cls(block_hashes=[h], medium=medium))
        return out

    def cache_full_blocks(
        self,
        request: Any,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
    ) -> None:
        """Cache ``blocks[num_cached_blocks:num_full_blocks]`` under the
        request's block hashes (null blocks skipped), for
        ``kv_cache_group_id``. With events on, queues one ``BlockStored``."""
        self._cache_full_blocks_py(
            request, blocks, num_cached_blocks, num_full_blocks, block_size,
            kv_cache_group_id,
        )

    def touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Take a reference on each block of a prefix-cache hit; a free block
        leaves the free queue (O(1))."""
        if type(blocks) is not list and type(blocks) is not tuple:
            blocks = list(blocks)  # iterated twice below
        self._touch(blocks)
        if self.metrics_collector:
            self._report_touch(blocks)

    def get_cached_block(
        self, block_hash: bytes, kv_cache_group_ids: Sequence[int]
    ) -> list[KVCacheBlock] | None:
        """The earliest block cached under ``block_hash`` for every group, or
        None if any group misses."""
        if not isinstance(block_hash, bytes):
            _check_hash(block_hash, "block_hash")
        cache = self._map._table
        ret = []
        for group_id in kv_cache_group_ids:
            if group_id.__class__ is int:
                key = block_hash + group_id.to_bytes(_GROUP_ID_BYTES, "big")
            else:
                key = block_hash + _group_suffix(group_id)
            entry = cache.get(key)
            if entry is None:
                return None
            if entry.__class__ is dict:
                entry = next(iter(entry.values()))
            ret.append(entry)
        return ret

    def find_longest_cache_hit(
        self,
        block_hashes: Sequence[bytes],
        kv_cache_group_ids: Sequence[int],
        max_blocks: int | None = None,
    ) -> list[list[KVCacheBlock]]:
        """Per group, the blocks of the longest prefix of ``block_hashes``
        (at most ``max_blocks`` long) that hits in every group: what calling
        ``get_cached_block`` per hash until the first miss gives, regrouped."""
        group_ids = list(kv_cache_group_ids)
        hashes = iter(block_hashes)
        if max_blocks is not None:
            if not isinstance(max_blocks, int):
                raise TypeError(
                    f"max_blocks must be an int or None, got {type(max_blocks).__name__}"
                )
            if max_blocks < 0:
                raise ValueError(f"max_blocks must be >= 0, got {max_blocks}")
        if not group_ids:
            return []
        suffixes = [_group_suffix(g) for g in group_ids]
        ret: list[list[KVCacheBlock]] = [[] for _ in suffixes]
        cache = self._map._table
        for block_hash in islice(hashes, max_blocks):
            if not isinstance(block_hash, bytes):
                _check_hash(block_hash, "block_hash")
            hit = []
            for suffix in suffixes:
                entry = cache.get(block_hash + suffix)
                if entry is None:
                    return ret
                if entry.__class__ is dict:
                    entry = next(iter(entry.values()))
                hit.append(entry)
            for group_blocks, block in zip(ret, hit):
                group_blocks.append(block)
        return ret

    # -- counts ----------------------------------------------------------------

    def get_num_free_blocks(self) -> int:
        return self._queue._num_free

    def get_usage(self) -> float:
        """Fraction of the usable blocks (all but the null block) in use."""
        total = self._num_gpu_blocks - 1
        if not total:
            return 0
        return 1.0 - self._queue._num_free / total

    # -- allocation and freeing ------------------------------------------------

    def _allocate(
        self, num_blocks: int, evict: bool, removed: list[bytes] | None
    ) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` blocks from the queue head, each with
        ``ref_cnt == 1``; if ``evict``, drop their cached hashes first (the
        keys go to ``removed``)."""
        _check_out_list(removed, "removed")
        if not isinstance(num_blocks, int):
            raise TypeError(f"num_blocks must be an int, got {type(num_blocks).__name__}")
        queue = self._queue
        num_free = queue._num_free
        if num_blocks < 0:
            raise ValueError(f"Cannot get a negative number of blocks ({num_blocks})")
        if num_blocks > num_free:
            raise ValueError(
                f"Cannot get {num_blocks} free blocks from the pool ({num_free} free)"
            )
        if num_blocks == 0:
            return []
        tok = self._tok
        head = queue._head
        block = head._next
        ret = []
        # One walk does popleft_n, the eviction and the ref counts.
        if evict and self._v33:
            ret = queue.popleft_n(num_blocks)
            evict33 = self._evict33
            by_block = self.cached_block_hashes_by_block
            for block in ret:
                if block._hash is not None or by_block:
                    evict33(block, removed)
                block._ref_cnt = 1
            return ret
        if evict:
            pop = self._map._pop
            for _ in range(num_blocks):
                ret.append(block)
                key = block._hash
                # A hash the map does not hold stays on the block, as in vLLM.
                if key is not None and pop(key, block._block_id) is not None:
                    block._hash = None
                    if removed is not None:
                        removed.append(key)
                last = block
                block = block._next
                last._prev = tok
                last._next = None
                last._ref_cnt = 1
        else:
            for _ in range(num_blocks):
                ret.append(block)
                last = block
                block = block._next
                last._prev = tok
                last._next = None
                last._ref_cnt = 1
        head._next = block
        block._prev = head
        queue._num_free = num_free - num_blocks
        return ret

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block; those reaching 0 go to the
        queue tail in the given order (callers pass a request's blocks in
        reverse, so a chain's tail is evicted before its shared prefix)."""
        blocks = ordered_blocks if type(ordered_blocks) is list else list(ordered_blocks)
        if self._v33:
            return self._free33(blocks, False)
        tok = self._tok
        count_null = self._count_null
        null_underflow = False
        # Checking pass. An accepted block's ref_cnt is negated as a "seen"
        # mark, so a repeat reads < 1 like a double free; no ref_cnt is
        # negative before the call, so every negative one is a mark.
        ok = False
        try:
            for block in blocks:
                if block._owner is not tok:  # another pool's null block too
                    break
                if block._is_null:
                    if count_null and block._ref_cnt == _NULL_REF_CNT_MIN:
                        null_underflow = True
                        break
                    continue
                ref_cnt = block._ref_cnt
                if ref_cnt < 1:
                    break
                block._ref_cnt = -ref_cnt
            else:
                ok = True
        except AttributeError:  # not a block: reported below
            pass
        finally:
            if not ok:
                self._unmark_free(blocks)
        if null_underflow:
            raise ValueError(f"the null block's ref_cnt would go below {_NULL_REF_CNT_MIN}")
        if not ok:
            if self._queue._adopt(blocks):
                return self.free_blocks(blocks)
            self._raise_bad_free(blocks)
        queue = self._queue
        tail = queue._tail
        last = tail._prev
        num_appended = 0
        for block in blocks:
            if block._is_null:
                if count_null:
                    block._ref_cnt -= 1
                continue
            ref_cnt = -1 - block._ref_cnt
            block._ref_cnt = ref_cnt
            # _prev is tok: not in the queue (ref_cnt writes never move blocks).
            if ref_cnt == 0 and block._prev is tok:
                block._prev = last
                last._next = block
                last = block
                num_appended += 1
        last._next = tail
        tail._prev = last
        queue._num_free += num_appended

    def _unmark_free(self, blocks: list[Any]) -> None:
        tok = self._tok
        for block in blocks:
            if isinstance(block, KVCacheBlock) and block._owner is tok and block._ref_cnt < 0:
                block._ref_cnt = -block._ref_cnt

    def _raise_bad_free(self, blocks: list[Any]) -> None:
        tok = self._tok
        seen: set[int] = set()
        for block in blocks:
            _check_owned(block, tok, "free_blocks()")
            if block._is_null:
                continue
            if id(block) in seen:
                raise ValueError(f"free_blocks(): block {block._block_id} given twice")
            if block._ref_cnt < 1:
                raise ValueError(
                    f"free_blocks(): double free of block {block._block_id} (ref_cnt is 0)"
                )
            seen.add(id(block))
        raise AssertionError("free_blocks(): no bad block found")  # pragma: no cover

    def _touch(self, blocks: Sequence[KVCacheBlock]) -> None:
        """Take a reference on each block of a prefix-cache hit; a free block
        leaves the queue in O(1). Null blocks are skipped."""
        if type(blocks) is not list and type(blocks) is not tuple:
            blocks = list(blocks)
        tok = self._tok
        # ref_cnt stays within int32 even if every entry is the same block.
        limit = _INT32_MAX - len(blocks)
        ok = False
        try:
            for block in blocks:
                if block._owner is not tok or block._ref_cnt > limit:
                    break
            else:
                ok = True
        except AttributeError:  # not a block: reported below
            pass
        if not ok:
            for block in blocks:
                _check_owned(block, tok, "touch()", self._queue)
                if block._ref_cnt > limit:
                    raise ValueError(f"touch(): block {block._block_id}: ref_cnt would overflow")
        num_removed = 0
        count_null = self._count_null
        for block in blocks:
            if block._is_null:
                if count_null:
                    block._ref_cnt += 1  # never queued
                continue
            prev = block._prev
            if prev is not tok:  # in the queue
                nxt = block._next
                prev._next = nxt
                nxt._prev = prev
                block._prev = tok
                block._next = None
                num_removed += 1
            block._ref_cnt += 1
        self._queue._num_free -= num_removed

    # -- the prefix cache ------------------------------------------------------

    def _evict_block(self, block: KVCacheBlock, removed: list[bytes] | None) -> bool:
        """Drop ``block``'s hash from the prefix cache (not the allocation);
        True if it was cached."""
        _check_out_list(removed, "removed")
        try:
            ok = block._owner is self._tok
        except AttributeError:  # not a block: reported below
            ok = False
        if not ok:
            _check_owned(block, self._tok, "_evict_block()", self._queue)
        return self._evict(block, removed)

    def _evict(self, block: KVCacheBlock, removed: list[bytes] | None) -> bool:
        if self._v33:
            return self._evict33(block, removed)
        key = block._hash
        if key is None:
            return False
        if self._map._pop(key, block._block_id) is None:
            return False
        block._hash = None
        if removed is not None:
            removed.append(key)
        return True

    def _evict_block_ids(self, block_ids: list[int], removed: list[bytes] | None) -> None:
        """Drop the hashes of the blocks with these ids, all checked first."""
        if type(block_ids) is not list:
            raise TypeError(f"block_ids must be a list, got {type(block_ids).__name__}")
        _check_out_list(removed, "removed")
        ids = block_ids
        n = self._num_gpu_blocks
        for block_id in ids:
            if not isinstance(block_id, int):
                raise TypeError(f"block id must be an int, got {type(block_id).__name__}")
            if not 0 <= block_id < n:
                raise ValueError(f"Invalid block_id {block_id}: the pool has blocks 0..{n - 1}")
        blocks = self._blocks
        if len(blocks) != n:
            self._raise_blocks_modified()
        for block_id in ids:
            if not self._is_own_block(blocks[block_id], block_id):
                self._raise_blocks_modified()
        for block_id in ids:
            self._evict(blocks[block_id], removed)

    def _is_own_block(self, block: Any, block_id: int) -> bool:
        try:
            return block._owner is self._tok and block._block_id == block_id
        except AttributeError:
            return False

    def _raise_blocks_modified(self) -> None:
        # The public list is the caller's to mutate, but the pool finds its
        # blocks through it: refuse rather than act on the wrong objects.
        raise RuntimeError(
            "pool.blocks was modified: it no longer holds this pool's blocks 0..n-1 in order"
        )

    def _cache_blocks(
        self,
        blocks: Sequence[KVCacheBlock],
        start: int,
        stop: int,
        block_hashes: Sequence[bytes],
        group_id: int,
        stored: list[bytes] | None,
    ) -> None:
        """Cache ``blocks[start:stop]`` (null blocks skipped) under
        ``block_hashes[i] + group suffix``; the bare hashes go to ``stored``."""
        _check_out_list(stored, "stored")
        if start >= stop:
            return
        if start < 0:
            raise ValueError(f"start must be >= 0, got {start}")
        suffix = _group_suffix(group_id)
        num_hashes = len(block_hashes)
        if num_hashes < stop:
            raise ValueError(f"{num_hashes} block hashes cannot cover {stop} blocks")
        new_blocks = blocks[start:stop]
        tok = self._tok
        new_hashes = []
        # Setting the hash in the checking pass marks the block: a repeat
        # then fails like a block that is already cached. Undone on failure.
        i = start
        failed = True
        try:
            for i, block in enumerate(new_blocks, start):
                if block._owner is not tok:  # another pool's null block too
                    break
                if block._is_null:
                    continue
                if block._hash is not None:
                    break
                block_hash = block_hashes[i]
                if not isinstance(block_hash, bytes):
                    break
                block._hash = block_hash + suffix
                new_hashes.append(block_hash)
            else:
                failed = False
        except AttributeError:  # not a block: reported below
            pass
        finally:
            if failed:  # also when block_hashes[i] raised
                for block in new_blocks[: i - start]:
                    if not block._is_null:
                        block._hash = None
        if failed:
            if self._queue._adopt(new_blocks):
                return self._cache_blocks(blocks, start, stop, block_hashes, group_id, stored)
            self._raise_bad_cache(new_blocks, start, block_hashes)
        insert = self._map._insert
        for block in new_blocks:
            if not block._is_null:
                insert(block._hash, block)
        if stored is not None:
            stored.extend(new_hashes)

    def _raise_bad_cache(
        self, new_blocks: Sequence[Any], start: int, block_hashes: Sequence[Any]
    ) -> None:
        tok = self._tok
        for i, block in enumerate(new_blocks, start):
            _check_owned(block, tok, "cache_full_blocks()")
            if block._is_null:
                continue
            if block._hash is not None:
                raise RuntimeError(
                    f"cache_full_blocks(): block {block._block_id} already has a hash "
                    f"({block._hash!r})"
                )
            _check_hash(block_hashes[i], f"block_hashes[{i}]")
        # Repeats only once every block passed (the compiled core's order).
        seen: set[int] = set()
        for block in new_blocks:
            if block._is_null:
                continue
            if id(block) in seen:
                raise ValueError(f"cache_full_blocks(): block {block._block_id} given twice")
            seen.add(id(block))
        raise AssertionError("cache_full_blocks(): no bad block found")  # pragma: no cover

    # -- the vLLM 0.33 line ------------------------------------------------------

    def _evict33(self, block: KVCacheBlock, removed: list[bytes] | None) -> bool:
        """vLLM 0.33's eviction: every key the block is cached under (its
        hash first, then its further keys) is popped from the map; the keys
        removed go to ``removed``; the block's hash and token count are reset
        whenever it had a key. True if any key was removed."""
        by_block = self.cached_block_hashes_by_block
        extra = None
        if by_block:
            extra = by_block.get(block._block_id)
            if extra is not None:
                extra = tuple(extra)  # may raise: nothing has changed yet
                del by_block[block._block_id]
        key = block._hash
        if key is None and not extra:
            return False
        keys = [key, *extra] if extra else [key]
        if key is None:
            del keys[0]
        pop = self._map._pop
        any_removed = False
        for key in keys:
            if key.__class__ is bytes and pop(key, block._block_id) is not None:
                any_removed = True
                if removed is not None:
                    removed.append(key)
        block._hash = None
        block._ntok = None
        return any_removed

    def _free_blocks34(self, ordered_blocks: Iterable[Any], evict_first: bool = False) -> None:
        """vLLM 0.34's ``free_blocks(ordered_blocks, evict_first=False)``
        (the 0.34 facade's ``free_blocks``): with ``evict_first`` released
        cached blocks go to the front as well, and other pools' blocks are
        handed on with the flag."""
        blocks = ordered_blocks if type(ordered_blocks) is list else list(ordered_blocks)
        self._free33(blocks, bool(evict_first))

    def _free33(self, blocks: list[Any], evict_first: bool) -> None:
        """vLLM 0.33's free_blocks: null blocks skipped (rule
        ``_kvpool_counts_null``: this pool's loses a reference, another
        pool's is handed to that pool); another pool's blocks
        handed to that pool afterwards; one reference dropped per appearance
        (a block may appear as often as it holds references); blocks reaching
        0 go to the head if they have no hash (or caching is off), else to the
        tail, in the order of the appearance that released them. A call that
        raises has changed nothing."""
        tok = self._tok
        others: dict[Any, list[Any]] = {}
        done = 0
        bad = None
        adopt_one = self._queue._adopt_one
        count_null = self._count_null
        for block in blocks:
            # vLLM: a block without a pool is this pool's.
            if getattr(block, "_owner", None) is not tok and not adopt_one(block):
                if count_null or not getattr(block, "is_null", False):
                    if not hasattr(block, "block_id"):
                        bad = block
                        break
                    # A kvpool block's pool, also where it is not shown.
                    other = (
                        block._pool if isinstance(block, KVCacheBlock) else getattr(block, "pool", None)
                    )
                    if isinstance(other, _weakref):
                        # vLLM 0.34's blocks hold their pool weakly; a block
                        # whose pool is gone is skipped, as vLLM skips it.
                        other = other()
                        if other is None:
                            done += 1
                            continue
                    if other is None or other is self:
                        bad = block
                        break
                    others.setdefault(other, []).append(block)
            elif not block._is_null:
                if block._ref_cnt < 1:
                    bad = block
                    break
                block._ref_cnt -= 1
            elif count_null:
                if block._ref_cnt == _NULL_REF_CNT_MIN:
                    bad = block
                    break
                block._ref_cnt -= 1
            done += 1
        if bad is not None:
            for block in blocks[:done]:
                if getattr(block, "_owner", None) is tok and (count_null or not block._is_null):
                    block._ref_cnt += 1
            if not isinstance(bad, KVCacheBlock) and not hasattr(bad, "block_id"):
                raise TypeError(
                    f"free_blocks(): expected a KVCacheBlock, got {type(bad).__name__}"
                )
            _check_owned(bad, tok, "free_blocks()")
            if bad._is_null:
                raise ValueError(
                    f"the null block's ref_cnt would go below {_NULL_REF_CNT_MIN}"
                )
            raise ValueError(
                f"free_blocks(): double free of block {bad._block_id} (ref_cnt is 0, or "
                "more appearances than references)"
            )
        # Released blocks go in front if they have no hash or, unless ordered
        # `by_hash` (caching on, or rule "by_hash"), all of them; rule "back"
        # then appends that run instead.
        off = self._free_off
        by_hash = (
            bool(self.enable_caching) or off == _FREE_CACHING_OFF["by_hash"]
        ) and not evict_first
        first_to_back = not by_hash and off == _FREE_CACHING_OFF["back"] and not evict_first
        first: list[KVCacheBlock] = []
        last: list[KVCacheBlock] = []
        seen: set[int] = set()
        for block in reversed(blocks):  # the last appearance releases a block
            if getattr(block, "_owner", None) is not tok or block._is_null:
                continue
            # A block queued already (its ref_cnt written from outside) stays put.
            if block._ref_cnt == 0 and block._prev is tok and id(block) not in seen:
                seen.add(id(block))
                (first if block._hash is None or not by_hash else last).append(block)
        first.reverse()
        last.reverse()
        queue = self._queue
        if first_to_back:
            queue.append_n(first)  # `last` is empty
        else:
            queue.prepend_n(first)
        queue.append_n(last)
        for other, group in others.items():
            if evict_first:
                other.free_blocks(group, evict_first=True)
            else:
                other.free_blocks(group)

    def _claim(self, blocks: Sequence[KVCacheBlock], evict: bool, removed: list[bytes] | None) -> None:
        """0.33's get_new_blocks after the pop (and the reuse watchers): each
        block, just taken from the queue, loses its hash keys if ``evict``
        and gets ``ref_cnt == 1``. All blocks are checked first."""
        _check_out_list(removed, "removed")
        blocks = list(blocks)
        tok = self._tok
        seen: set[int] = set()
        for block in blocks:
            _check_owned(block, tok, "_claim()", self._queue)
            if block._prev is not tok or block._ref_cnt != 0 or block._is_null:
                raise ValueError(
                    f"block {block._block_id} is not a block just taken from the free "
                    "queue (it is queued, in use or null)"
                )
            if id(block) in seen:
                raise ValueError(f"block {block._block_id} appears twice")
            seen.add(id(block))
        for block in blocks:
            if evict:
                self._evict33(block, removed)
            block._ref_cnt = 1

    def _unpin(self, blocks: Iterable[KVCacheBlock]) -> list[KVCacheBlock]:
        """0.33's unpin_blocks without the watchers: one reference dropped
        per appearance; blocks reaching 0 go to the tail, in the order of the
        appearance that released them. Changes nothing if it raises."""
        blocks = list(blocks)
        tok = self._tok
        for block in blocks:
            _check_owned(block, tok, "unpin_blocks()", self._queue)
            if block._is_null:
                raise ValueError("the null block cannot be unpinned")
        for done, block in enumerate(blocks):
            if block._ref_cnt < 1:
                for b in blocks[:done]:
                    b._ref_cnt += 1
                raise ValueError(
                    f"block {block._block_id} is unpinned with ref_cnt 0 "
                    "(more appearances than references?)"
                )
            block._ref_cnt -= 1
        released = []
        seen: set[int] = set()
        for block in reversed(blocks):
            if block._ref_cnt == 0 and block._prev is tok and id(block) not in seen:
                seen.add(id(block))
                released.append(block)
        released.reverse()
        self._queue.append_n(released)
        return blocks

    def _cache_blocks33(
        self,
        blocks: Sequence[KVCacheBlock],
        start: int,
        stop: int,
        block_hashes: Sequence[bytes],
        scale: int,
        group_id: int,
        block_size: int,
        block_mask: Sequence[Any] | None,
        removed: list[bytes] | None,
        stored: list[bytes] | None,
    ) -> None:
        """vLLM 0.33's cache_full_blocks without the events (see the
        compiled core's docstring): promotion of partial blocks included."""
        _check_out_list(removed, "removed")
        _check_out_list(stored, "stored")
        if start >= stop:
            return
        if start < 0:
            raise ValueError(f"num_cached_blocks must be >= 0, got {start}")
        suffix = _group_suffix(group_id)
        if isinstance(block_size, bool) or not isinstance(block_size, int):
            raise TypeError(f"block_size must be an int, got {type(block_size).__name__}")
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        if scale < 1:
            raise ValueError(f"scale must be >= 1, got {scale}")
        new_blocks = list(blocks[start:stop])
        n = len(new_blocks)
        mask = None
        if block_mask is not None:
            mask = [bool(x) for x in block_mask]
            if len(mask) != n:
                raise ValueError(f"block_mask has {len(mask)} entries for {n} new full blocks")
        if type(block_hashes) is list:
            hl, off = block_hashes, start
        else:
            if scale != 1:
                raise TypeError("block_hashes must be a list when scale > 1")
            hl, off = list(block_hashes[start:stop]), 0
        if len(hl) // scale < off + n:
            raise ValueError(
                f"the request has {len(hl) // scale} block hashes at this block size, "
                f"{start + n} are needed to cache blocks up to {start + n}"
            )
        tok = self._tok
        seen: set[int] = set()
        for j, block in enumerate(new_blocks):
            _check_owned(block, tok, "cache_full_blocks()", self._queue)
            if block._is_null or (mask is not None and not mask[j]):
                continue
            ntok = (start + j + 1) * block_size
            if block._hash is not None and (block._ntok is None or block._ntok >= ntok):
                raise RuntimeError(
                    f"block {block._block_id} already has a hash covering {block._ntok} "
                    f"tokens; only a partial block covering fewer than {ntok} can be promoted"
                )
            _check_hash(hl[(off + j + 1) * scale - 1], "block hash")
            if id(block) in seen:
                raise ValueError(f"block {block._block_id} appears twice")
            seen.add(id(block))
        cache = self._map
        for j, block in enumerate(new_blocks):
            if block._is_null or (mask is not None and not mask[j]):
                continue
            if block._hash is not None:  # partial -> full promotion
                self._evict33(block, removed)
            block_hash = hl[(off + j + 1) * scale - 1]
            key = block_hash + suffix
            entry = cache._table.get(key)
            present = entry is not None and (
                block._block_id in entry if entry.__class__ is dict
                else entry._block_id == block._block_id
            )
            if not present:
                block._hash = key
                block._ntok = (start + j + 1) * block_size
                cache._insert(key, block)
            if stored is not None:
                stored.append(block_hash)

    def _reset_cache(self) -> bool:
        """Forget every hash; only when no block but the null block is in use."""
        if self._num_gpu_blocks - self._queue._num_free != 1:
            return False
        self._check_blocks_list()  # before anything changes
        self._clear_map()
        self._forget_hashes()
        return True

    def _clear_map(self) -> None:
        """Empty the map: a new one (0.33's reset: before the reuse watchers
        fire), or in place (0.34's)."""
        if self._v34:
            self._map.clear()
        else:
            self._map = BlockHashToBlockMap()

    def _check_blocks_list(self) -> None:
        blocks = self._blocks
        tok = self._tok
        ok = len(blocks) == self._num_gpu_blocks
        try:
            for block_id, block in enumerate(blocks):
                if block._owner is not tok or block._block_id != block_id:
                    ok = False
                    break
        except AttributeError:
            ok = False
        if not ok:
            self._raise_blocks_modified()

    def _reset_hashes(self) -> None:
        """Every block's hash (and token count) forgotten."""
        self._check_blocks_list()
        self._forget_hashes()

    def _forget_hashes(self) -> None:
        for block in self._blocks:
            block._hash = None
            block._ntok = None
        # "Every block" includes the queue's sentinels (settable through the API).
        self._queue._head._hash = self._queue._tail._hash = None
        self._queue._head._ntok = self._queue._tail._ntok = None
