"""Bad input (SPEC section 6, docs/core-contract.md): one test per case.

Each test checks the exact exception type and that the call changed nothing
(free-queue order, every block's ref_cnt/hash/links, the map under every
known key, the event queue, the metrics). The last test runs a subset in a
``python -O`` subprocess: the checks must not rely on ``assert``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import kvpool

from _helpers import (
    BusyPool,
    FakeRequest,
    block_pool_class,
    check_invariants,
    check_pool_unchanged,
    check_queue_unchanged,
    check_raises,
    ids,
    key,
    make_hashes,
    pool_state,
)

TESTS_DIR = Path(__file__).resolve().parent


@pytest.fixture
def busy(BlockPool):
    return BusyPool(BlockPool)


@pytest.fixture
def other_pool(BlockPool):
    return BlockPool(12, True, 16)


@pytest.fixture
def standalone(FreeKVCacheBlockQueue, KVCacheBlock):
    blocks = [KVCacheBlock(i) for i in range(6)]
    queue = FreeKVCacheBlockQueue(blocks)
    queue.popleft_n(2)  # blocks 0, 1 are owned but out of the queue
    return queue, blocks


def naming(number: int) -> str:
    """A message that names ``number`` (as a whole number, not a digit of another)."""
    return rf"(?<![\d-]){number}(?!\d)"


# ---------------------------------------------------------------------------
# KVCacheBlock


@pytest.mark.parametrize("block_id", [True, 1.0, "1", None, b"1"])
def test_block_id_not_int(KVCacheBlock, block_id):
    check_raises(TypeError, KVCacheBlock, block_id)


@pytest.mark.parametrize("block_id", [2**31, -(2**31) - 1, 2**64])
def test_block_id_out_of_range(KVCacheBlock, block_id):
    check_raises(ValueError, KVCacheBlock, block_id)


@pytest.mark.parametrize("name", ["prev_free_block", "next_free_block"])
def test_block_constructor_links_must_be_none(KVCacheBlock, name):
    check_raises(ValueError, KVCacheBlock, 1, **{name: KVCacheBlock(2)})


@pytest.mark.parametrize(
    ("value", "exc"), [(-1, ValueError), (2**31, ValueError), (1.5, TypeError), ("1", TypeError)]
)
def test_block_constructor_bad_ref_cnt(KVCacheBlock, value, exc):
    check_raises(exc, KVCacheBlock, 1, ref_cnt=value)


@pytest.mark.parametrize("value", ["abc", 5, bytearray(b"abc")])
def test_block_constructor_bad_hash(KVCacheBlock, value):
    check_raises(TypeError, KVCacheBlock, 1, _block_hash=value)


@pytest.mark.parametrize(
    ("value", "exc"),
    [
        (-1, ValueError),
        (2**31, ValueError),
        (2**70, ValueError),
        (1.0, TypeError),
        (None, TypeError),
    ],
)
def test_ref_cnt_bad_value(KVCacheBlock, value, exc):
    b = KVCacheBlock(1, ref_cnt=3)
    check_raises(exc, setattr, b, "ref_cnt", value)
    assert b.ref_cnt == 3


@pytest.mark.parametrize("value", [-1, 2**31, "x"])
def test_ref_cnt_bad_value_on_pool_block(busy, value):
    block = busy.running[0]
    exc = TypeError if isinstance(value, str) else ValueError
    busy.unchanged(exc, setattr, block, "ref_cnt", value)


@pytest.mark.parametrize("value", ["abc", 5, bytearray(b"abc"), memoryview(b"abc")])
def test_block_hash_not_bytes(KVCacheBlock, value):
    b = KVCacheBlock(1)
    check_raises(TypeError, setattr, b, "block_hash", value)
    assert b.block_hash is None


def test_block_hash_set_twice(KVCacheBlock):
    b = KVCacheBlock(17)
    b.block_hash = b"first"
    check_raises(RuntimeError, setattr, b, "block_hash", b"second", match=naming(17))
    assert b.block_hash == b"first"


def test_block_hash_set_none_when_set(KVCacheBlock):
    b = KVCacheBlock(17)
    b.block_hash = b"first"
    check_raises(RuntimeError, setattr, b, "block_hash", None, match=naming(17))
    assert b.block_hash == b"first"


def test_block_hash_set_twice_on_pool_block(busy):
    block = busy.running[1]
    busy.unchanged(
        RuntimeError, setattr, block, "block_hash", key(b"new"), match=naming(block.block_id)
    )


# ---------------------------------------------------------------------------
# FreeKVCacheBlockQueue


@pytest.mark.parametrize("intruder", [None, 3, "block", object()])
def test_queue_constructor_non_block(FreeKVCacheBlockQueue, KVCacheBlock, intruder):
    blocks = [KVCacheBlock(0), intruder, KVCacheBlock(2)]
    check_raises(TypeError, FreeKVCacheBlockQueue, blocks)
    # Nothing became owned: the good blocks are still usable in a new queue.
    queue = FreeKVCacheBlockQueue([blocks[0], blocks[2]])
    assert queue.num_free_blocks == 2


def test_queue_constructor_duplicate(FreeKVCacheBlockQueue, KVCacheBlock):
    a, b = KVCacheBlock(0), KVCacheBlock(1)
    check_raises(ValueError, FreeKVCacheBlockQueue, [a, b, a])
    assert a.prev_free_block is None and a.next_free_block is None
    assert FreeKVCacheBlockQueue([a, b]).num_free_blocks == 2


def test_queue_constructor_block_of_another_queue(FreeKVCacheBlockQueue, standalone, KVCacheBlock):
    queue, blocks = standalone
    # blocks[0] is out of its queue but still owned by it for good.
    check_queue_unchanged(
        queue, blocks, ValueError, FreeKVCacheBlockQueue, [KVCacheBlock(9), blocks[0]]
    )
    check_queue_unchanged(queue, blocks, ValueError, FreeKVCacheBlockQueue, [blocks[3]])


def test_queue_constructor_block_of_a_pool(FreeKVCacheBlockQueue, busy):
    busy.unchanged(ValueError, FreeKVCacheBlockQueue, [busy.free_uncached[0]])
    busy.unchanged(ValueError, FreeKVCacheBlockQueue, [busy.running[0]])


def test_queue_constructor_sentinel(FreeKVCacheBlockQueue, standalone):
    queue, blocks = standalone
    check_queue_unchanged(
        queue, blocks, ValueError, FreeKVCacheBlockQueue, [queue.fake_free_list_head]
    )


def test_popleft_empty(FreeKVCacheBlockQueue):
    queue = FreeKVCacheBlockQueue([])
    check_queue_unchanged(queue, [], ValueError, queue.popleft, match="No free blocks available")


def test_popleft_n_beyond_count(standalone):
    queue, blocks = standalone
    exc = check_queue_unchanged(queue, blocks, ValueError, queue.popleft_n, 5)
    assert re.search(naming(5), str(exc)) and re.search(naming(4), str(exc)), exc


def test_popleft_n_negative(standalone):
    queue, blocks = standalone
    check_queue_unchanged(queue, blocks, ValueError, queue.popleft_n, -1)


@pytest.mark.parametrize("n", [1.0, "1", None])
def test_popleft_n_not_int(standalone, n):
    queue, blocks = standalone
    check_queue_unchanged(queue, blocks, TypeError, queue.popleft_n, n)


@pytest.mark.parametrize("intruder", [None, 1, "b"])
def test_remove_non_block(standalone, intruder):
    queue, blocks = standalone
    check_queue_unchanged(queue, blocks, TypeError, queue.remove, intruder)


def test_remove_block_not_owned(standalone, KVCacheBlock, FreeKVCacheBlockQueue):
    queue, blocks = standalone
    # A stand-alone block joins the queue on first use (as in vLLM), but
    # it is not in the list: removing it fails as for any block outside.
    stranger = KVCacheBlock(3)  # same id as a member, different block
    check_queue_unchanged(queue, blocks, RuntimeError, queue.remove, stranger)
    other = [KVCacheBlock(i) for i in range(6)]
    other_queue = FreeKVCacheBlockQueue(other)  # kept alive: its blocks stay its own
    check_queue_unchanged(queue, blocks, ValueError, queue.remove, other[3])
    assert other_queue.num_free_blocks == 6


@pytest.mark.parametrize("which", ["fake_free_list_head", "fake_free_list_tail"])
def test_remove_sentinel(standalone, which):
    queue, blocks = standalone
    check_queue_unchanged(queue, blocks, ValueError, queue.remove, getattr(queue, which))


def test_remove_block_not_in_queue(standalone):
    queue, blocks = standalone
    check_queue_unchanged(queue, blocks, RuntimeError, queue.remove, blocks[0])


def test_remove_pool_block_not_in_queue(busy):
    block = busy.running[0]
    busy.unchanged(RuntimeError, busy.pool.free_block_queue.remove, block)


@pytest.mark.parametrize("intruder", [None, 1, "b"])
def test_append_non_block(standalone, intruder):
    queue, blocks = standalone
    check_queue_unchanged(queue, blocks, TypeError, queue.append, intruder)


def test_append_block_not_owned(standalone, KVCacheBlock, FreeKVCacheBlockQueue):
    queue, blocks = standalone
    other = [KVCacheBlock(i) for i in range(2)]
    other_queue = FreeKVCacheBlockQueue(other)  # kept alive: its blocks stay its own
    other_queue.remove(other[0])
    check_queue_unchanged(queue, blocks, ValueError, queue.append, other[0])


def test_append_standalone_block_is_adopted(standalone, KVCacheBlock, FreeKVCacheBlockQueue):
    # vLLM appends any block object; kvpool adopts a stand-alone one, which
    # then belongs to this queue and to no other.
    queue, blocks = standalone
    stranger = KVCacheBlock(0)  # same id as a member, different block
    before = ids(queue.get_all_free_blocks())
    queue.append(stranger)
    assert ids(queue.get_all_free_blocks()) == before + [0]
    assert queue.fake_free_list_tail.prev_free_block is stranger
    other = FreeKVCacheBlockQueue([])
    check_raises(ValueError, other.append, stranger)
    queue.remove(stranger)
    check_raises(ValueError, other.append_n, [stranger])
    assert other.num_free_blocks == 0


@pytest.mark.parametrize("which", ["fake_free_list_head", "fake_free_list_tail"])
def test_append_sentinel(standalone, which):
    queue, blocks = standalone
    check_queue_unchanged(queue, blocks, ValueError, queue.append, getattr(queue, which))


def test_append_block_already_in_queue(standalone):
    queue, blocks = standalone
    for b in blocks[2:]:
        check_queue_unchanged(queue, blocks, ValueError, queue.append, b)


def test_append_pool_block_already_in_queue(busy):
    busy.unchanged(ValueError, busy.pool.free_block_queue.append, busy.free_uncached[0])
    busy.unchanged(ValueError, busy.pool.free_block_queue.append, busy.free_cached[0])


def test_append_block_of_another_pool(busy, other_pool):
    (foreign,) = other_pool.get_new_blocks(1)
    busy.unchanged(ValueError, busy.pool.free_block_queue.append, foreign)


def test_append_n_one_already_in_queue(standalone):
    queue, blocks = standalone
    check_queue_unchanged(queue, blocks, ValueError, queue.append_n, [blocks[0], blocks[4]])
    check_queue_unchanged(
        queue, blocks, ValueError, queue.append_n, [blocks[1], blocks[0], blocks[2]]
    )


def test_append_n_same_block_twice(standalone):
    queue, blocks = standalone
    check_queue_unchanged(
        queue, blocks, ValueError, queue.append_n, [blocks[0], blocks[1], blocks[0]]
    )


def test_append_n_non_block(standalone):
    queue, blocks = standalone
    check_queue_unchanged(queue, blocks, TypeError, queue.append_n, [blocks[0], None])


def test_append_n_not_owned(standalone, KVCacheBlock, FreeKVCacheBlockQueue):
    queue, blocks = standalone
    other = [KVCacheBlock(7)]
    other_queue = FreeKVCacheBlockQueue(other)  # kept alive: its blocks stay its own
    other_queue.remove(other[0])
    check_queue_unchanged(queue, blocks, ValueError, queue.append_n, [blocks[0], other[0]])
    new = [KVCacheBlock(7), KVCacheBlock(8)]
    before = ids(queue.get_all_free_blocks())
    queue.append_n([blocks[0], *new])
    assert ids(queue.get_all_free_blocks()) == before + [0, 7, 8]


# ---------------------------------------------------------------------------
# BlockHashToBlockMap


@pytest.mark.parametrize("bad_key", ["k", 1, None, bytearray(b"k"), (b"k", 0)])
def test_map_key_not_bytes(BlockHashToBlockMap, KVCacheBlock, bad_key):
    m = BlockHashToBlockMap()
    b = KVCacheBlock(1)
    m.insert(b"k", b)
    check_raises(TypeError, m.get_one_block, bad_key)
    check_raises(TypeError, m.insert, bad_key, KVCacheBlock(2))
    check_raises(TypeError, m.pop, bad_key, 1)
    assert len(m) == 1 and m.get_one_block(b"k") is b


@pytest.mark.parametrize("bad_block", [None, 1, "block"])
def test_map_insert_non_block(BlockHashToBlockMap, KVCacheBlock, bad_block):
    m = BlockHashToBlockMap()
    check_raises(TypeError, m.insert, b"k", bad_block)
    assert len(m) == 0 and m.get_one_block(b"k") is None


def test_pool_map_bad_key(busy):
    busy.unchanged(TypeError, busy.pool.cached_block_hash_to_block.insert, "k", busy.running[3])


# ---------------------------------------------------------------------------
# BlockPool construction


@pytest.mark.parametrize("n", [10.0, "10", None, True, False])
def test_num_gpu_blocks_not_int(BlockPool, n):
    check_raises(TypeError, BlockPool, n, True, 16)


@pytest.mark.parametrize("n", [0, -1, -(2**40), 2**31 - 2, 2**63])
def test_num_gpu_blocks_out_of_range(BlockPool, n):
    exc = check_raises(ValueError, BlockPool, n, True, 16)
    if abs(n) < 2**32:
        assert re.search(naming(n), str(exc)), exc


@pytest.mark.parametrize("size", [0, -16])
def test_hash_block_size_below_one(BlockPool, size):
    exc = check_raises(ValueError, BlockPool, 8, True, size)
    assert re.search(naming(size), str(exc)), exc


@pytest.mark.parametrize("size", [16.0, "16", None])
def test_hash_block_size_not_int(BlockPool, size):
    check_raises(TypeError, BlockPool, 8, True, size)


# ---------------------------------------------------------------------------
# get_new_blocks


def test_over_allocation(busy):
    free = busy.pool.get_num_free_blocks()
    busy.unchanged(
        ValueError,
        busy.pool.get_new_blocks,
        free + 1,
        match=re.escape(f"Cannot get {free + 1} free blocks from the pool ({free} free)"),
    )


def test_over_allocation_empty_pool(BlockPool):
    pool = BlockPool(1, True, 16)
    check_raises(
        ValueError,
        pool.get_new_blocks,
        1,
        match=re.escape("Cannot get 1 free blocks from the pool (0 free)"),
    )


@pytest.mark.parametrize("n", [-1, -(2**40)])
def test_negative_allocation(busy, n):
    busy.unchanged(ValueError, busy.pool.get_new_blocks, n)


@pytest.mark.parametrize("n", [1.0, "1", None])
def test_allocation_not_int(busy, n):
    busy.unchanged(TypeError, busy.pool.get_new_blocks, n)


# ---------------------------------------------------------------------------
# free_blocks


def test_double_free(busy):
    block = busy.free_uncached[0]
    busy.unchanged(ValueError, busy.pool.free_blocks, [block], match=naming(block.block_id))


def test_double_free_of_cached_free_block(busy):
    block = busy.free_cached[1]
    exc = busy.unchanged(ValueError, busy.pool.free_blocks, [block])
    assert re.search(naming(block.block_id), str(exc)) and re.search("(?i)double free", str(exc)), (
        exc
    )


def test_double_free_after_valid_blocks(busy):
    # The valid blocks listed first must not be decremented either.
    bad = busy.free_uncached[0]
    busy.unchanged(ValueError, busy.pool.free_blocks, [busy.running[3], busy.running[2], bad])


def test_same_block_twice_in_one_free(busy):
    block = busy.running[0]
    busy.pool.touch([block])  # ref_cnt 2: freeing twice would be legal count-wise
    busy.pool.take_events()
    busy.unchanged(
        ValueError,
        busy.pool.free_blocks,
        [block, busy.running[1], block],
        match=naming(block.block_id),
    )


def test_same_block_twice_in_one_free_ref_one(busy):
    block = busy.running[3]
    busy.unchanged(ValueError, busy.pool.free_blocks, reversed([block, block]))


def test_free_block_of_another_pool(busy, other_pool):
    (foreign,) = other_pool.get_new_blocks(1)
    before = pool_state(other_pool)
    busy.unchanged(
        ValueError,
        busy.pool.free_blocks,
        [busy.running[3], foreign],
        match=naming(foreign.block_id),
    )
    assert pool_state(other_pool) == before


def test_free_null_block_of_another_pool(busy, other_pool):
    # Only the pool's own null block is skipped: another pool's null block is
    # a foreign block (SPEC section 6), as touch() treats it too. (The
    # contract's free_blocks row, "null blocks are skipped entirely", could be
    # read as skipping any is_null block; this test pins the SPEC reading.)
    busy.unchanged(
        ValueError, busy.pool.free_blocks, [busy.running[3], other_pool.null_block], match=naming(0)
    )
    assert other_pool.null_block.ref_cnt == 0


def test_free_standalone_block(busy, KVCacheBlock, other_pool):
    # A stand-alone block is adopted by the pool that frees it (vLLM's pools
    # take any block object); freed with ref_cnt 0 it is refused (vLLM
    # would drive ref_cnt to -1).
    zero = KVCacheBlock(5)
    busy.unchanged(ValueError, busy.pool.free_blocks, [zero], match=naming(5))
    assert zero.ref_cnt == 0
    stranger = KVCacheBlock(5, ref_cnt=1)
    free_before = busy.pool.get_num_free_blocks()
    busy.pool.free_blocks([stranger])
    assert stranger.ref_cnt == 0
    assert busy.pool.free_block_queue.fake_free_list_tail.prev_free_block is stranger
    assert busy.pool.get_num_free_blocks() == free_before + 1
    # Adopted: it now belongs to this pool, and another pool refuses it.
    busy.pool.touch([stranger])
    check_pool_unchanged(other_pool, ValueError, other_pool.free_blocks, [stranger])
    check_pool_unchanged(other_pool, ValueError, other_pool.touch, [stranger])


def test_free_sentinel(busy):
    head = busy.pool.free_block_queue.fake_free_list_head
    busy.unchanged(ValueError, busy.pool.free_blocks, [head])


@pytest.mark.parametrize("intruder", [None, 1, "b"])
def test_free_non_block(busy, intruder):
    busy.unchanged(TypeError, busy.pool.free_blocks, [busy.running[3], intruder])


# ---------------------------------------------------------------------------
# touch


def test_touch_block_of_another_pool(busy, other_pool):
    foreign = other_pool.blocks[3]
    busy.unchanged(
        ValueError,
        busy.pool.touch,
        [busy.free_cached[0], busy.running[0], foreign],
        match=naming(3),
    )
    assert foreign.ref_cnt == 0


def test_touch_null_block_of_another_pool(busy, other_pool):
    busy.unchanged(
        ValueError, busy.pool.touch, [busy.free_cached[0], other_pool.null_block], match=naming(0)
    )


def test_touch_standalone_block(busy, KVCacheBlock):
    # Adopted, as vLLM takes any block: one more reference, no queue change.
    stranger = KVCacheBlock(2)
    queue_before = ids(busy.pool.free_block_queue.get_all_free_blocks())
    busy.pool.touch([stranger])
    assert stranger.ref_cnt == 1
    assert ids(busy.pool.free_block_queue.get_all_free_blocks()) == queue_before


def test_touch_sentinel(busy):
    busy.unchanged(ValueError, busy.pool.touch, [busy.pool.free_block_queue.fake_free_list_tail])


@pytest.mark.parametrize("intruder", [None, 1])
def test_touch_non_block(busy, intruder):
    busy.unchanged(TypeError, busy.pool.touch, [busy.free_cached[0], intruder])


def test_touch_ref_cnt_overflow(busy):
    # ref_cnt is bounded by 2**31 - 1: a touch past it must be refused cleanly.
    # The contract does not name the type; it must be one of these two, and
    # the same in every core (next test).
    block = busy.running[3]
    block.ref_cnt = 2**31 - 1
    before = pool_state(busy.pool, busy.keys)
    with pytest.raises((OverflowError, ValueError)):
        busy.pool.touch([busy.running[0], block])
    assert pool_state(busy.pool, busy.keys) == before
    block.ref_cnt = 1
    check_invariants(busy.pool)


def test_touch_ref_cnt_overflow_same_type_in_all_cores(all_cores):
    raised = {}
    for core in all_cores:
        pool = block_pool_class(core)(4, True, 16)
        (block,) = pool.get_new_blocks(1)
        block.ref_cnt = 2**31 - 1
        try:
            pool.touch([block])
        except Exception as exc:  # noqa: BLE001 - the type is what is compared
            raised[core.__name__] = type(exc)
        else:
            raised[core.__name__] = None
        assert block.ref_cnt == 2**31 - 1
    assert len(set(raised.values())) == 1, raised


# ---------------------------------------------------------------------------
# evict_blocks / _maybe_evict_cached_block


@pytest.mark.parametrize("offset", [0, 1, 2**40])
def test_evict_out_of_range(busy, offset):
    n = busy.pool.num_gpu_blocks
    bad = n + offset
    exc = busy.unchanged(
        ValueError,
        busy.pool.evict_blocks,
        [busy.running[0].block_id, busy.free_cached[0].block_id, bad],
    )
    if offset < 2**32:
        # Names the id and the pool's size (as n, or as the range 0..n-1).
        assert re.search(naming(bad), str(exc)), exc
        assert re.search(naming(n), str(exc)) or re.search(
            rf"0\s*\.\.\.?\s*{n - 1}(?!\d)", str(exc)
        ), exc


@pytest.mark.parametrize("bad", [-1, -12])
def test_evict_negative_id(busy, bad):
    exc = busy.unchanged(ValueError, busy.pool.evict_blocks, [busy.running[0].block_id, bad])
    assert re.search(naming(bad), str(exc)), exc


@pytest.mark.parametrize("bad", [1.0, "1", None])
def test_evict_non_int_id(busy, bad):
    busy.unchanged(TypeError, busy.pool.evict_blocks, [busy.running[0].block_id, bad])


def test_maybe_evict_block_of_another_pool(busy, other_pool):
    # The metrics collector is part of the state: a refused call must not
    # have closed a sampled block's metrics either.
    foreign = other_pool.blocks[busy.running[0].block_id]
    busy.unchanged(ValueError, busy.pool._maybe_evict_cached_block, foreign)


def test_maybe_evict_non_block(busy):
    busy.unchanged(TypeError, busy.pool._maybe_evict_cached_block, None)


# ---------------------------------------------------------------------------
# cache_full_blocks


def test_cache_too_few_hashes(busy):
    pool = busy.pool
    blocks = pool.get_new_blocks(3)
    pool.take_events()
    request = FakeRequest(make_hashes(2, b"new"))
    exc = busy.unchanged(ValueError, pool.cache_full_blocks, request, blocks, 0, 3, 16, 0)
    assert re.search(naming(2), str(exc)) and re.search(naming(3), str(exc)), exc


def test_cache_too_few_hashes_with_block_size_view(busy):
    pool = busy.pool
    blocks = pool.get_new_blocks(2)
    pool.take_events()
    request = FakeRequest(make_hashes(3, b"new"))  # one 32-token block only
    busy.unchanged(ValueError, pool.cache_full_blocks, request, blocks, 0, 2, 32, 0)


def test_cache_block_already_hashed(busy):
    pool = busy.pool
    fresh = pool.get_new_blocks(2)
    pool.take_events()
    blocks = fresh + [busy.running[0]]
    request = FakeRequest(make_hashes(3, b"new"))
    busy.unchanged(
        RuntimeError,
        pool.cache_full_blocks,
        request,
        blocks,
        0,
        3,
        16,
        0,
        match=naming(busy.running[0].block_id),
    )


def test_cache_same_block_twice(busy):
    pool = busy.pool
    (fresh,) = pool.get_new_blocks(1)
    pool.take_events()
    request = FakeRequest(make_hashes(2, b"new"))
    busy.unchanged(ValueError, pool.cache_full_blocks, request, [fresh, fresh], 0, 2, 16, 0)


@pytest.mark.parametrize("bad_hash", ["text", 42, None, bytearray(b"x")])
def test_cache_non_bytes_hash(busy, bad_hash):
    pool = busy.pool
    blocks = pool.get_new_blocks(2)
    pool.take_events()
    request = FakeRequest([make_hashes(1, b"new")[0], bad_hash])
    busy.unchanged(TypeError, pool.cache_full_blocks, request, blocks, 0, 2, 16, 0)


def test_cache_block_of_another_pool(busy, other_pool):
    pool = busy.pool
    (fresh,) = pool.get_new_blocks(1)
    (foreign,) = other_pool.get_new_blocks(1)
    pool.take_events()
    request = FakeRequest(make_hashes(2, b"new"))
    busy.unchanged(ValueError, pool.cache_full_blocks, request, [fresh, foreign], 0, 2, 16, 0)
    assert foreign.block_hash is None


def test_cache_non_block(busy):
    pool = busy.pool
    (fresh,) = pool.get_new_blocks(1)
    pool.take_events()
    request = FakeRequest(make_hashes(2, b"new"))
    busy.unchanged(TypeError, pool.cache_full_blocks, request, [fresh, "block"], 0, 2, 16, 0)


def test_cache_negative_num_cached(busy):
    pool = busy.pool
    blocks = pool.get_new_blocks(2)
    pool.take_events()
    request = FakeRequest(make_hashes(2, b"new"))
    busy.unchanged(ValueError, pool.cache_full_blocks, request, blocks, -1, 2, 16, 0)


@pytest.mark.parametrize("group", [-1, 2**32])
def test_cache_group_id_out_of_range(busy, group):
    pool = busy.pool
    blocks = pool.get_new_blocks(2)
    pool.take_events()
    busy.unchanged(
        OverflowError,
        pool.cache_full_blocks,
        FakeRequest(make_hashes(2, b"new")),
        blocks,
        0,
        2,
        16,
        group,
    )


@pytest.mark.parametrize("group", [0.0, "0", None])
def test_cache_group_id_not_int(busy, group):
    pool = busy.pool
    blocks = pool.get_new_blocks(2)
    pool.take_events()
    busy.unchanged(
        TypeError,
        pool.cache_full_blocks,
        FakeRequest(make_hashes(2, b"new")),
        blocks,
        0,
        2,
        16,
        group,
    )


@pytest.mark.parametrize("block_size", [24, 8, 0, -16])
def test_cache_block_size_not_a_multiple(busy, block_size):
    pool = busy.pool
    blocks = pool.get_new_blocks(1)
    pool.take_events()
    busy.unchanged(
        ValueError,
        pool.cache_full_blocks,
        FakeRequest(make_hashes(4, b"new")),
        blocks,
        0,
        1,
        block_size,
        0,
    )


# ---------------------------------------------------------------------------
# Lookups


@pytest.mark.parametrize("bad_hash", ["text", 1, None])
def test_get_cached_block_non_bytes(busy, bad_hash):
    busy.unchanged(TypeError, busy.pool.get_cached_block, bad_hash, [0])


@pytest.mark.parametrize(
    ("group", "exc"),
    [(-1, OverflowError), (2**32, OverflowError), ("0", TypeError), (None, TypeError)],
)
def test_get_cached_block_bad_group(busy, group, exc):
    busy.unchanged(exc, busy.pool.get_cached_block, busy.hashes[0], [0, group])


def test_find_longest_negative_max_blocks(busy):
    busy.unchanged(ValueError, busy.pool.find_longest_cache_hit, busy.hashes, [0], -1)


def test_find_longest_non_bytes_hash(busy):
    busy.unchanged(TypeError, busy.pool.find_longest_cache_hit, ["text"] + busy.hashes, [0])


@pytest.mark.parametrize(
    ("group", "exc"), [(-1, OverflowError), (2**32, OverflowError), ("0", TypeError)]
)
def test_find_longest_bad_group(busy, group, exc):
    busy.unchanged(exc, busy.pool.find_longest_cache_hit, busy.hashes, [0, group])


# ---------------------------------------------------------------------------
# The same checks without assert statements: python -O.

OPTIMIZED_SCRIPT = textwrap.dedent(
    """
    import importlib, re, sys

    from _helpers import BusyPool, FakeRequest, block_pool_class, check_queue_unchanged, make_hashes

    if __debug__ or sys.flags.optimize < 1:
        sys.exit("not running under -O")
    for name in sys.argv[1:]:
        core = importlib.import_module(name)
        busy = BusyPool(block_pool_class(core))
        pool = busy.pool
        free = pool.get_num_free_blocks()
        busy.unchanged(ValueError, pool.get_new_blocks, free + 1)
        busy.unchanged(ValueError, pool.get_new_blocks, -1)
        busy.unchanged(ValueError, pool.free_blocks, [busy.free_uncached[0]])
        busy.unchanged(ValueError, pool.free_blocks, [busy.running[3], busy.running[3]])
        other = block_pool_class(core)(12, True, 16)
        busy.unchanged(ValueError, pool.free_blocks, other.get_new_blocks(1))
        busy.unchanged(ValueError, pool.touch, [busy.free_cached[0], other.blocks[2]])
        busy.unchanged(ValueError, pool.evict_blocks, [1, pool.num_gpu_blocks])
        busy.unchanged(RuntimeError, setattr, busy.running[0], "block_hash", b"again")
        fresh = pool.get_new_blocks(2)
        pool.take_events()
        busy.unchanged(ValueError, pool.cache_full_blocks, FakeRequest(make_hashes(1)), fresh, 0, 2, 16, 0)
        busy.unchanged(TypeError, pool.cache_full_blocks, FakeRequest([b"x", 5]), fresh, 0, 2, 16, 0)
        queue = pool.free_block_queue
        busy.unchanged(ValueError, queue.append, queue.get_all_free_blocks()[0])
        busy.unchanged(RuntimeError, queue.remove, busy.running[0])
        busy.unchanged(ValueError, queue.popleft_n, queue.num_free_blocks + 1)
        for exc, bad in ((ValueError, 0), (TypeError, 2.0)):
            try:
                block_pool_class(core)(bad, True, 16)
            except exc:
                pass
            else:
                sys.exit(f"{name}: BlockPool({bad!r}) did not raise {exc.__name__}")
        print("ok", name)
    """
)


def test_checks_hold_under_python_O(all_cores):
    env = dict(os.environ)
    package_root = str(Path(kvpool.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(TESTS_DIR), package_root, env.get("PYTHONPATH")])
    )
    names = [core.__name__ for core in all_cores]
    proc = subprocess.run(
        [sys.executable, "-O", "-c", OPTIMIZED_SCRIPT, *names],
        capture_output=True,
        text=True,
        env=env,
        # Not the repository root: `-c` puts the working directory first on
        # sys.path, where the source tree (without the built module) would
        # shadow the installed package.
        cwd=TESTS_DIR,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == [w for name in names for w in ("ok", name)]


def test_compiled_internals_refuse_bad_sizes_and_reinit(core):
    # Reachable from Python, so they must not corrupt memory: a store of a
    # negative size, and re-initialising a queue that already holds blocks.
    if core.__name__ == "kvpool._core":
        for bad in (-1, -2, -3, 2**31):
            with pytest.raises((ValueError, OverflowError)):
                core._Store(bad)
    queue = core.FreeKVCacheBlockQueue([core.KVCacheBlock(i) for i in range(3)])
    with pytest.raises(RuntimeError):
        queue.__init__([core.KVCacheBlock(7)])
    assert [b.block_id for b in queue.get_all_free_blocks()] == [0, 1, 2]
