"""KVCacheBlock: attributes, hash key, repr, identity, lifetime."""

from __future__ import annotations

import gc

import pytest

from _helpers import FakeRequest, key, make_hashes


def test_defaults(KVCacheBlock):
    b = KVCacheBlock(3)
    assert b.block_id == 3
    assert b.ref_cnt == 0
    assert b.block_hash is None
    assert b._block_hash is None
    assert b.is_null is False
    assert b.prev_free_block is None
    assert b.next_free_block is None


def test_constructor_keywords(KVCacheBlock):
    b = KVCacheBlock(block_id=7, ref_cnt=2, _block_hash=b"abc", is_null=True)
    assert (b.block_id, b.ref_cnt, b.block_hash, b.is_null) == (7, 2, b"abc", True)
    assert b._block_hash == b"abc"


@pytest.mark.parametrize("block_id", [0, 1, -1, 2**31 - 1, -(2**31)])
def test_block_id_range(KVCacheBlock, block_id):
    assert KVCacheBlock(block_id).block_id == block_id


def test_block_id_is_read_only(KVCacheBlock):
    b = KVCacheBlock(1)
    with pytest.raises(AttributeError):
        b.block_id = 2
    assert b.block_id == 1


@pytest.mark.parametrize("name", ["prev_free_block", "next_free_block"])
def test_links_are_read_only(KVCacheBlock, name):
    b = KVCacheBlock(1)
    with pytest.raises(AttributeError):
        setattr(b, name, KVCacheBlock(2))
    assert getattr(b, name) is None


def test_ref_cnt_read_write(KVCacheBlock):
    b = KVCacheBlock(1)
    b.ref_cnt = 5
    assert b.ref_cnt == 5
    b.ref_cnt += 1
    assert b.ref_cnt == 6
    b.ref_cnt = 2**31 - 1
    assert b.ref_cnt == 2**31 - 1
    b.ref_cnt = 0
    assert b.ref_cnt == 0


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, True), (False, False), (1, True), (0, False), ("", False), ([0], True)],
)
def test_is_null_stored_as_bool(KVCacheBlock, value, expected):
    b = KVCacheBlock(1)
    b.is_null = value
    assert b.is_null is expected


def test_block_hash_set_reset_set(KVCacheBlock):
    b = KVCacheBlock(1)
    b.block_hash = b"first\x00\x00\x00\x00"
    assert b.block_hash == b"first\x00\x00\x00\x00"
    assert b._block_hash == b.block_hash
    b.reset_hash()
    assert b.block_hash is None
    b.reset_hash()  # idempotent
    assert b.block_hash is None
    b.block_hash = b"second"
    assert b.block_hash == b"second"


def test_block_hash_none_on_unhashed_block_is_allowed(KVCacheBlock):
    b = KVCacheBlock(1)
    b.block_hash = None
    assert b.block_hash is None
    b.block_hash = b"x"
    assert b.block_hash == b"x"


def test_block_hash_keeps_the_object(KVCacheBlock):
    h = make_hashes(1)[0] + b"\x00\x00\x00\x01"
    b = KVCacheBlock(1)
    b.block_hash = h
    assert b.block_hash == h
    assert type(b.block_hash) is bytes


def test_empty_hash_is_a_hash(KVCacheBlock):
    b = KVCacheBlock(1)
    b.block_hash = b""
    assert b.block_hash == b""
    with pytest.raises(RuntimeError):
        b.block_hash = b"other"


def test_repr_standalone(KVCacheBlock):
    assert repr(KVCacheBlock(3)) == (
        "KVCacheBlock(block_id=3, ref_cnt=0, _block_hash=None, "
        "prev_free_block=None, next_free_block=None)"
    )
    b = KVCacheBlock(12, ref_cnt=4, _block_hash=b"ab\x00\x00\x00\x01")
    assert repr(b) == (
        "KVCacheBlock(block_id=12, ref_cnt=4, _block_hash=b'ab\\x00\\x00\\x00\\x01', "
        "prev_free_block=None, next_free_block=None)"
    )


def test_repr_in_queue(FreeKVCacheBlockQueue, KVCacheBlock):
    blocks = [KVCacheBlock(i) for i in range(6)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.num_free_blocks == 6
    assert repr(blocks[3]) == (
        "KVCacheBlock(block_id=3, ref_cnt=0, _block_hash=None, "
        "prev_free_block=2, next_free_block=4)"
    )
    # The ends link to the sentinels, whose id is -1.
    assert repr(blocks[0]).endswith("prev_free_block=-1, next_free_block=1)")
    assert repr(blocks[5]).endswith("prev_free_block=4, next_free_block=-1)")


def test_repr_of_pool_blocks(BlockPool):
    pool = BlockPool(4, True, 16)
    assert repr(pool.blocks[0]) == (
        "KVCacheBlock(block_id=0, ref_cnt=0, _block_hash=None, "
        "prev_free_block=None, next_free_block=None)"
    )
    assert repr(pool.blocks[2]) == (
        "KVCacheBlock(block_id=2, ref_cnt=0, _block_hash=None, "
        "prev_free_block=1, next_free_block=3)"
    )
    (b,) = pool.get_new_blocks(1)
    h = make_hashes(1)[0]
    pool.cache_full_blocks(FakeRequest([h]), [b], 0, 1, 16, 0)
    assert repr(b) == (
        f"KVCacheBlock(block_id=1, ref_cnt=1, _block_hash={key(h)!r}, "
        "prev_free_block=None, next_free_block=None)"
    )


def test_identity_equality_and_hash(KVCacheBlock):
    a, b = KVCacheBlock(1), KVCacheBlock(1)
    assert a == a
    assert a != b
    assert not (a == b)
    assert len({a, b}) == 2
    assert {a: 1}[a] == 1
    assert hash(a) == hash(a)


def test_pool_blocks_are_stable_objects(BlockPool):
    pool = BlockPool(5, True, 16)
    blocks = pool.blocks
    assert pool.blocks is blocks
    first = [pool.blocks[i] for i in range(5)]
    for i in range(5):
        assert pool.blocks[i] is first[i]
        assert first[i].block_id == i
    got = pool.get_new_blocks(2)
    assert got[0] is first[1] and got[1] is first[2]
    assert pool.free_block_queue.get_all_free_blocks()[0] is first[3]
    assert pool.null_block is first[0]
    # Attributes written through one reference are seen through another.
    first[4].is_null = False
    got[0].ref_cnt = 3
    assert pool.blocks[1].ref_cnt == 3
    got[0].ref_cnt = 1


def test_pool_block_hash_is_a_key(BlockPool):
    pool = BlockPool(4, True, 16)
    hashes = make_hashes(2)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(FakeRequest(hashes), blocks, 0, 2, 16, 3)
    assert [b.block_hash for b in blocks] == [key(hashes[0], 3), key(hashes[1], 3)]
    blocks[0].reset_hash()
    assert blocks[0].block_hash is None


# ---------------------------------------------------------------------------
# Lifetime: blocks, queues and maps may outlive the object that made them.


def _exercise(block):
    """Read and write every attribute of a block; nothing may crash."""
    assert isinstance(block.block_id, int)
    repr(block)
    for neighbour in (block.prev_free_block, block.next_free_block):
        assert neighbour is None or isinstance(neighbour.block_id, int)
    block.ref_cnt = block.ref_cnt + 1
    block.is_null = not block.is_null
    block.reset_hash()
    block.block_hash = b"after-death"
    assert block.block_hash == b"after-death"
    block.reset_hash()


def test_blocks_outlive_their_pool(BlockPool):
    pool = BlockPool(8, True, 16, enable_kv_cache_events=True)
    hashes = make_hashes(3)
    running = pool.get_new_blocks(3)
    pool.cache_full_blocks(FakeRequest(hashes), running, 0, 3, 16, 0)
    pool.free_blocks(running[1:][::-1])
    kept = [pool.blocks[i] for i in range(8)] + running
    queue = pool.free_block_queue
    null = pool.null_block
    del pool, running
    gc.collect()
    # Attributes keep their last values.
    assert [b.block_id for b in kept[:8]] == list(range(8))
    assert kept[1].ref_cnt == 1 and kept[2].ref_cnt == 0
    assert kept[1].block_hash == key(hashes[0])
    assert null.is_null is True
    for b in kept:
        _exercise(b)
    # The queue the pool owned is still a valid object.
    assert queue.num_free_blocks == len(queue.get_all_free_blocks())
    gc.collect()


def test_queue_and_map_outlive_their_pool(BlockPool):
    pool = BlockPool(6, True, 16)
    queue = pool.free_block_queue
    hash_map = pool.cached_block_hash_to_block
    (b,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(FakeRequest(make_hashes(1)), [b], 0, 1, 16, 0)
    k = b.block_hash
    del pool
    gc.collect()
    # Whatever the queue holds now, using it must not crash.
    for _ in range(queue.num_free_blocks):
        popped = queue.popleft()
        _exercise(popped)
    assert queue.get_all_free_blocks() == []
    found = hash_map.get_one_block(k)
    assert found is None or found is b
    assert len(hash_map) == 1
    _exercise(b)
    gc.collect()


def test_blocks_outlive_a_standalone_queue(FreeKVCacheBlockQueue, KVCacheBlock):
    blocks = [KVCacheBlock(i) for i in range(6)]
    queue = FreeKVCacheBlockQueue(blocks)
    queue.popleft()
    head = queue.fake_free_list_head
    del queue
    gc.collect()
    for b in blocks:
        _exercise(b)
    assert head.block_id == -1
    repr(head)


def test_pool_dropped_while_blocks_in_use_then_reused(BlockPool):
    # Building many pools and dropping them, keeping one block of each alive,
    # exercises the lifetime paths of whichever layout the core uses.
    kept = []
    for n in (1, 2, 5, 33):
        pool = BlockPool(n, True, 16)
        kept.append(pool.blocks[n - 1])
        if n > 1:
            kept.extend(pool.get_new_blocks(1))
        del pool
    gc.collect()
    for b in kept:
        _exercise(b)


def test_writing_ref_cnt_never_moves_a_block(BlockPool):
    pool = BlockPool(4, True, 16)
    free_block = pool.blocks[2]
    free_block.ref_cnt = 5
    assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == [1, 2, 3]
    free_block.ref_cnt = 0
    (used,) = pool.get_new_blocks(1)
    used.ref_cnt = 0
    assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == [2, 3]
    used.ref_cnt = 1
