"""The vLLM 0.33 line (``kvpool.v0_33``) over both cores: 0.33's free order,
several keys per block, partial entries and their promotion, reuse watchers,
cross-pool frees, the events' wire format, and the bad-input policy.

The exact agreement with vLLM 0.33.0's own pool is proven in
``tests/vllm33`` (run in the vLLM environment); these tests pin the same
behaviour down without vLLM, on both cores, as the figures of
``shared/VLLM-VERSIONS.md`` give it."""

from __future__ import annotations

import gc
from types import ModuleType
from typing import Any

import msgspec
import pytest

from _helpers import block_pool_class, check_raises, hash_chain, ids, key
from kvpool.metrics import KVCacheMetricsCollector
from kvpool.v0_33.block_pool import PoolArgumentError
from kvpool.v0_33 import (
    MEDIUM_CPU,
    AllBlocksCleared,
    BlockHashListWithBlockSize,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    block_class,
    make_block_pool_class,
    resolve_block_hashes,
    to_event_extra_keys,
)

_classes: dict[str, type] = {}


@pytest.fixture(scope="session")
def Pool33(core: ModuleType) -> type:
    cls = _classes.get(core.__name__)
    if cls is None:
        cls = _classes[core.__name__] = make_block_pool_class(core)
    return cls


class Req:
    """What the 0.33 pool reads of a vLLM ``Request``."""

    def __init__(self, hashes: list[bytes], block_size: int = 4, **kw: Any) -> None:
        self.block_hashes = hashes
        self.all_token_ids = kw.pop("all_token_ids", list(range(len(hashes) * block_size)))
        self.lora_request = kw.pop("lora_request", None)
        self.mm_features = kw.pop("mm_features", [])
        self.cache_salt = kw.pop("cache_salt", None)
        self.prompt_embeds = None
        self.session_id = kw.pop("session_id", None)
        assert not kw, kw


def state(pool: Any) -> dict[str, Any]:
    """Everything observable about a 0.33 pool."""
    return {
        "order": ids(pool.free_block_queue.get_all_free_blocks()),
        "blocks": [
            (b.block_id, b.ref_cnt, b.block_hash, b.block_hash_num_tokens, b.is_null)
            for b in pool.blocks
        ],
        "map": {k: sorted(v) if isinstance(v, dict) else v.block_id
                for k, v in pool.cached_block_hash_to_block._cache.items()},
        "by_block": {i: sorted(v) for i, v in pool.cached_block_hashes_by_block.items()},
        "watchers": list(pool._reuse_watchers),
        "events": msgspec.msgpack.encode(pool.kv_event_queue),
        "free": pool.get_num_free_blocks(),
    }


def check_invariants33(pool: Any) -> None:
    free = pool.free_block_queue.get_all_free_blocks()
    free_ids = ids(free)
    assert len(set(free_ids)) == len(free_ids) == pool.get_num_free_blocks()
    for b in pool.blocks[1:]:
        assert (b.ref_cnt == 0) == (b.block_id in free_ids), b
    # Every key a block has is in the map under that block, and back.
    expected = set()
    for b in pool.blocks:
        if b.block_hash is not None:
            expected.add((b.block_hash, b.block_id))
        for k in pool.cached_block_hashes_by_block.get(b.block_id, ()):
            expected.add((k, b.block_id))
    got = set()
    for k, v in pool.cached_block_hash_to_block._cache.items():
        for bid in (v if isinstance(v, dict) else {v.block_id: v}):
            got.add((k, bid))
    assert got == expected


def test_free_order_is_vllm_033s(Pool33: type) -> None:
    # shared/VLLM-VERSIONS.md, "Free-queue order, measured", 0.33.0 row.
    pool = Pool33(10, True, 4)
    hashes = hash_chain([1, 2])
    a = pool.get_new_blocks(3)
    b = pool.get_new_blocks(2)
    pool.cache_full_blocks(Req(hashes), a, 0, 2, 4, 0)
    pool.free_blocks(reversed(a))
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [3, 6, 7, 8, 9, 2, 1]
    pool.free_blocks(reversed(b))
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [5, 4, 3, 6, 7, 8, 9, 2, 1]
    off = Pool33(6, False, 4)
    c = off.get_new_blocks(3)
    off.free_blocks(reversed(c))
    assert ids(off.free_block_queue.get_all_free_blocks()) == [3, 2, 1, 4, 5]
    # The null block is skipped by touch and free_blocks: its count stays 0.
    off.touch([off.null_block])
    off.free_blocks([off.null_block, off.null_block])
    assert off.null_block.ref_cnt == 0
    check_invariants33(pool)
    check_invariants33(off)


def test_block_class_and_repr(core: ModuleType, Pool33: type) -> None:
    Block = block_class(core)
    pool = Pool33(4, True, 4)
    assert type(pool.null_block) is Block
    assert isinstance(pool.null_block, core.KVCacheBlock)
    assert pool.blocks[1].pool is pool
    b = Block(7, 2, _block_hash=b"h", _block_hash_num_tokens=16)
    assert (b.block_id, b.ref_cnt, b.block_hash, b.block_hash_num_tokens, b.pool) == (7, 2, b"h", 16, None)
    assert repr(b) == (
        "KVCacheBlock(block_id=7, ref_cnt=2, _block_hash=b'h', "
        "_block_hash_num_tokens=16, prev_free_block=None, next_free_block=None)"
    )
    b.reset_hash()
    assert b.block_hash is None and b.block_hash_num_tokens is None
    b.set_block_hash(b"k", num_tokens=8)
    assert (b.block_hash, b.block_hash_num_tokens) == (b"k", 8)
    check_raises(RuntimeError, b.set_block_hash, b"x")
    assert (b.block_hash, b.block_hash_num_tokens) == (b"k", 8)
    b.ref_cnt += 1  # vLLM's copy-on-write code writes the count
    assert b.ref_cnt == 3
    marker = object()
    assert Block(1, pool=marker).pool is marker


def test_pool_of_a_dead_pool_is_none(Pool33: type, core: ModuleType) -> None:
    pool = Pool33(4, True, 4)
    queue = pool.free_block_queue
    block = pool.get_new_blocks(1)[0]
    del pool
    gc.collect()
    if core.__name__ == "kvpool._core":
        assert block.pool is None  # the compiled core holds no cycle
    assert block.ref_cnt == 1
    assert queue.num_free_blocks == 2


def test_queue_prepend_and_iter_after(core: ModuleType) -> None:
    Block = block_class(core)
    blocks = [Block(i) for i in range(6)]
    q = core.FreeKVCacheBlockQueue(blocks)
    a, b = q.popleft_n(2)
    q.prepend_n([b, a])
    assert ids(q.get_all_free_blocks()) == [1, 0, 2, 3, 4, 5]
    assert ids(q.iter_blocks_after(None)) == [1, 0, 2, 3, 4, 5]
    assert ids(q.iter_blocks_after(blocks[2])) == [3, 4, 5]
    assert ids(q.iter_blocks_after(q.fake_free_list_head)) == [1, 0, 2, 3, 4, 5]
    assert ids(q.iter_blocks_after(q.fake_free_list_tail)) == []
    it = q.iter_blocks_after(blocks[2])
    assert next(it).block_id == 3
    q.remove(blocks[3])  # the cursor left the queue: the walk ends
    assert list(it) == []
    check_raises(ValueError, q.prepend_n, [blocks[0]])  # already queued
    assert ids(q.get_all_free_blocks()) == [1, 0, 2, 4, 5]
    check_raises(TypeError, core.FreeKVCacheBlockQueue, [Block(1), core.KVCacheBlock(2)])


def test_partial_entry_promotion_and_events(Pool33: type) -> None:
    pool = Pool33(8, True, 4, enable_kv_cache_events=True, medium=MEDIUM_CPU)
    hashes = hash_chain([1, 2, 3, 4])
    req = Req(hashes, session_id="s1")
    (blk,) = pool.get_new_blocks(1)
    # Block size 8 = two hash blocks; the first 4 tokens are a partial entry.
    k = pool.cache_partial_block(req, blk, 4, 0, 8)
    assert k == key(hashes[0]) == blk.block_hash and blk.block_hash_num_tokens == 4
    assert pool.cache_partial_block(req, blk, 4, 0, 8) == k  # already cached: no event
    # Full: promoted to the last sub-hash of the 8-token block.
    pool.cache_full_blocks(req, [blk], 0, 1, 8, 0)
    assert blk.block_hash == key(hashes[1]) and blk.block_hash_num_tokens == 8
    events = pool.take_events()
    assert [type(e) for e in events] == [BlockStored, BlockRemoved, BlockStored]
    assert events[1] == BlockRemoved(
        block_hashes=[int.from_bytes(hashes[0][-8:], "big")], medium="CPU", group_idx=0
    )
    assert events[2].parent_block_hash is None and events[2].session_id == "s1"
    assert events[2].token_ids == list(range(8)) and events[2].group_idx == 0
    # Tagged maps; defaults left out.
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(events[1]))
    assert decoded == {"type": "BlockRemoved", "block_hashes": events[1].block_hashes,
                       "medium": "CPU", "group_idx": 0}
    batch = msgspec.msgpack.decode(msgspec.msgpack.encode(KVEventBatch(ts=1.0, events=[AllBlocksCleared()])))
    assert batch == [1.0, [{"type": "AllBlocksCleared"}], None]
    check_invariants33(pool)


def test_several_keys_and_move(Pool33: type) -> None:
    pool = Pool33(8, True, 4, enable_kv_cache_events=True)
    hashes = hash_chain([1, 2, 3, 4])
    req = Req(hashes)
    src, dst = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, [src], 0, 1, 8, 0)  # key: hashes[1], 8 tokens
    pool.cache_partial_block(req, src, 4, 1, 8)  # a second key, group 1
    assert pool.cached_block_hashes_by_block == {src.block_id: {key(hashes[0], 1)}}
    pool.take_events()
    pool.move_block_hashes(src, dst)
    assert src.block_hash is None and dst.block_hash == key(hashes[1])
    assert dst.block_hash_num_tokens == 8
    assert pool.cached_block_hashes_by_block == {dst.block_id: {key(hashes[0], 1)}}
    assert pool.take_events() == []  # entries stay live: no events
    check_invariants33(pool)
    # Evicting drops every key, one BlockRemoved each, with its group.
    assert pool._maybe_evict_cached_block(dst)
    evs = pool.take_events()
    assert sorted(e.group_idx for e in evs) == [0, 1]
    assert dst.block_hash is None and pool.cached_block_hashes_by_block == {}
    check_invariants33(pool)
    # Bad input changes nothing.
    pool.cache_full_blocks(req, [src], 0, 1, 8, 0)
    before = state(pool)
    check_raises(RuntimeError, pool.move_block_hashes, dst, src)  # dst has a hash
    check_raises(RuntimeError, pool.cache_full_blocks, req, [src], 0, 1, 4, 0)  # no promotion
    # Where vLLM asserts: a ValueError that code catching AssertionError catches too.
    exc = check_raises(PoolArgumentError, pool.cache_partial_block, req, src, 3, 0, 8)
    assert isinstance(exc, ValueError) and isinstance(exc, AssertionError)
    assert state(pool) == before


def test_unpin_and_reuse_watchers(Pool33: type) -> None:
    pool = Pool33(6, True, 4)
    seen: list[tuple[int, Any]] = []
    blocks = pool.get_new_blocks(5)
    pool.cache_full_blocks(Req(hash_chain([1])), blocks, 0, 1, 4, 0)
    pool.touch([blocks[0]])  # ref 2
    pool.unpin_blocks(blocks[:2], lambda b: seen.append((b.block_id, b.block_hash)))
    assert blocks[0].ref_cnt == 1 and blocks[1].ref_cnt == 0
    assert list(pool._reuse_watchers) == [1, 2]
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [2]
    # get_new_blocks fires the watcher before evicting: it sees the block.
    pool.free_blocks([blocks[0]])
    got = pool.get_new_blocks(2)
    assert ids(got) == [2, 1]
    assert seen == [(2, None), (1, key(hash_chain([1])[0]))]
    assert got[1].block_hash is None  # evicted after the watcher ran
    check_raises(ValueError, pool.unpin_blocks, [pool.null_block], print)
    check_raises(ValueError, pool.unpin_blocks, [blocks[4], blocks[4]], print)
    # reset_prefix_cache fires the pending ones.
    pool.unpin_blocks(got, lambda b: seen.append((b.block_id, "reset")))
    pool.free_blocks(blocks[2:5])
    assert pool.reset_prefix_cache()
    assert seen[-2:] == [(2, "reset"), (1, "reset")] and not pool._reuse_watchers
    check_invariants33(pool)


def test_cross_pool_free_and_mixed_cores(all_cores: list[ModuleType]) -> None:
    pools = [make_block_pool_class(c)(5, True, 4) for c in all_cores]
    pools.append(make_block_pool_class(all_cores[0])(5, False, 4, medium=MEDIUM_CPU))
    taken = [p.get_new_blocks(2) for p in pools]
    mixed = [b for pair in zip(*taken) for b in pair]
    pools[0].free_blocks(reversed(mixed))
    for p, blocks in zip(pools, taken):
        assert all(b.ref_cnt == 0 for b in blocks)
        assert p.get_num_free_blocks() == 4
        check_invariants33(p)


def test_block_mask_and_hybrid_view(Pool33: type) -> None:
    pool = Pool33(8, True, 2)
    hashes = hash_chain([1, 2, 3, 4, 5, 6])
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(Req(hashes, 2), blocks, 0, 3, 4, 0, block_mask=[True, False, True])
    # Block size 4 over hash size 2: the key is the last sub-hash.
    assert blocks[0].block_hash == key(hashes[1]) and blocks[0].block_hash_num_tokens == 4
    assert blocks[1].block_hash is None
    assert blocks[2].block_hash == key(hashes[5]) and blocks[2].block_hash_num_tokens == 12
    view = resolve_block_hashes(hashes, 2, 4)
    assert isinstance(view, BlockHashListWithBlockSize) and list(view) == hashes[1::2]
    assert resolve_block_hashes(hashes, 2, 2) is hashes
    check_raises(ValueError, pool.cache_full_blocks, Req(hashes, 2), blocks, 0, 3, 4, 0, block_mask=[True])
    check_invariants33(pool)


def test_events_extra_keys_lora_salt_mm(Pool33: type) -> None:
    class Lora:
        lora_name, lora_path, adapter_id, name = "ad", "/p", 3, "ad"

    class Pos:
        def __init__(self, offset: int, length: int) -> None:
            self.offset, self.length = offset, length

    class Feat:
        def __init__(self, ident: str, offset: int, length: int) -> None:
            self.identifier, self.mm_position = ident, Pos(offset, length)

    pool = Pool33(8, True, 4, enable_kv_cache_events=True, num_hash_lookahead_tokens=2)
    req = Req(hash_chain([1, 2, 3]), lora_request=Lora(), cache_salt="salt",
              mm_features=[Feat("img", 2, 4)], all_token_ids=list(range(14)))
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req, blocks, 0, 3, 4, 0)
    (ev,) = pool.take_events()
    assert ev.lora_id == 3 and ev.lora_name == "ad"
    # With lookahead, block 1's extra keys cover tokens up to 10: the image
    # (2..6) reaches into block 1 only; the salt is on the first block.
    assert ev.extra_keys == [("ad", ("img", 2), "salt"), ("ad", ("img", -2)), ("ad",)]
    assert ev.lookahead_token_ids == [[4, 5], [8, 9], [12, 13]]
    assert to_event_extra_keys([None, (("lora", "a", "p"),)]) == [None, ("a",)]


def test_bad_input_changes_nothing(Pool33: type) -> None:
    pool = Pool33(6, True, 4, enable_kv_cache_events=True,
                  metrics_collector=KVCacheMetricsCollector(1.0))
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(Req(hash_chain([1, 2])), blocks, 0, 2, 4, 0)
    pool.take_events()
    before = state(pool)
    check_raises(ValueError, pool.get_new_blocks, 4)
    check_raises(ValueError, pool.free_blocks, [blocks[0], blocks[0]])
    other = Pool33(3, True, 4)
    check_raises(ValueError, pool.touch, [other.blocks[1]])
    check_raises(TypeError, pool.free_blocks, [object()])
    check_raises(ValueError, pool.evict_blocks, [99])
    check_raises(TypeError, pool._insert_block_hash, "k", blocks[2], 4)
    check_raises(ValueError, pool._insert_block_hash, b"k", other.blocks[1], 4)
    check_raises(TypeError, Pool33, 4, True, 4, False, None, "x")
    check_raises(ValueError, Pool33, 4, True, 4, False, None, -1)
    assert state(pool) == before
    pool.free_blocks(blocks)
    check_raises(ValueError, pool.free_blocks, [blocks[0]])  # double free
    check_invariants33(pool)


@pytest.mark.parametrize("line", ["0.15", "0.33"])
def test_adoption_grows_and_outlives_the_pool(core: ModuleType, line: str) -> None:
    # Stand-alone blocks adopted well past the first growth of the store,
    # mixed with pool blocks in the queue, then the pool dropped while the
    # blocks live on: nothing may crash, every block keeps its state.
    from _helpers import block_pool_class

    if line == "0.33":
        Pool, Block = make_block_pool_class(core), block_class(core)
    else:
        Pool, Block = block_pool_class(core), core.KVCacheBlock
    pool = Pool(8, True, 4)
    strangers = [Block(100 + i, ref_cnt=1) for i in range(50)]
    pool.free_blocks(strangers[:20])
    pool.free_blocks(reversed(strangers[20:]))
    assert pool.get_num_free_blocks() == 7 + 50
    taken = pool.get_new_blocks(57)
    assert {b.block_id for b in taken} == set(range(1, 8)) | {100 + i for i in range(50)}
    pool.touch(strangers[:5])
    pool.free_blocks(taken)
    assert strangers[0].ref_cnt == 1 and strangers[5].ref_cnt == 0
    other = Pool(3, True, 4)
    check_raises(ValueError, other.touch, [strangers[7]])  # adopted: not other's
    queue = pool.free_block_queue
    del pool
    gc.collect()
    assert [b.ref_cnt for b in strangers[:6]] == [1, 1, 1, 1, 1, 0]
    assert queue.num_free_blocks == 57 - 5
    del queue
    gc.collect()
    if core.__name__ == "kvpool._core":  # detached: no neighbours (contract)
        assert all(b.prev_free_block is None for b in strangers)
    repr(strangers[-1])


def test_queue_from_empty_list_takes_the_first_blocks_line(core) -> None:
    """``FreeKVCacheBlockQueue([])`` (as vLLM's own tests build one) names no
    line; the first block appended decides it, in both cores."""
    for cls in (core.KVCacheBlock33, core.KVCacheBlock):
        queue = core.FreeKVCacheBlockQueue([])
        blocks = [cls(i) for i in range(3)]
        queue.append_n(blocks)
        assert [b.block_id for b in queue.get_all_free_blocks()] == [0, 1, 2]
        assert queue.popleft() is blocks[0]
        # Settled: a block of the other line is refused, nothing changed.
        other = (core.KVCacheBlock if cls is core.KVCacheBlock33 else core.KVCacheBlock33)(7)
        with pytest.raises(TypeError):
            queue.append(other)
        assert [b.block_id for b in queue.get_all_free_blocks()] == [1, 2]


def test_queue_from_empty_list_settles_after_its_sentinels_were_read(core) -> None:
    # vLLM's own test reads the sentinels of FreeKVCacheBlockQueue([]) before
    # it appends its first block.
    queue = core.FreeKVCacheBlockQueue([])
    queue.append_n([])
    assert queue.fake_free_list_head.next_free_block is queue.fake_free_list_tail
    blocks = [core.KVCacheBlock33(i) for i in range(2)]
    queue.append_n(blocks)
    assert queue.fake_free_list_head.next_free_block is blocks[0]
    assert blocks[1].next_free_block is queue.fake_free_list_tail
    assert queue.num_free_blocks == 2


def test_null_block_ref_cnt_may_be_set_below_zero(core) -> None:
    # vLLM before 0.33 drives the null block's count below 0 (its own
    # subclasses of its pool do so with `block.ref_cnt -= 1`); no other
    # block's.
    pool = block_pool_class(core)(4, True, 16)
    pool.null_block.ref_cnt = -1
    assert pool.null_block.ref_cnt == -1
    with pytest.raises(ValueError):
        pool.blocks[1].ref_cnt = -1
    assert pool.blocks[1].ref_cnt == 0
