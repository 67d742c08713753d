"""FreeKVCacheBlockQueue: standalone and inside a pool."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from _helpers import ids


@pytest.fixture
def blocks(KVCacheBlock):
    return [KVCacheBlock(i) for i in range(6)]


@pytest.fixture
def queue(FreeKVCacheBlockQueue, blocks):
    return FreeKVCacheBlockQueue(blocks)


def check_links(queue):
    """The sentinels and the links agree with get_all_free_blocks()."""
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    chain = [head, *queue.get_all_free_blocks(), tail]
    assert head.prev_free_block is None
    assert tail.next_free_block is None
    for left, right in zip(chain, chain[1:]):
        assert left.next_free_block is right
        assert right.prev_free_block is left
    assert queue.num_free_blocks == len(chain) - 2


def test_initial_order(queue, blocks):
    assert queue.num_free_blocks == 6
    assert queue.get_all_free_blocks() == blocks
    check_links(queue)


def test_sentinels(queue, blocks):
    head, tail = queue.fake_free_list_head, queue.fake_free_list_tail
    assert head.block_id == -1 and tail.block_id == -1
    assert head is not tail
    assert head.next_free_block is blocks[0]
    assert tail.prev_free_block is blocks[5]
    assert blocks[0].prev_free_block is head
    assert blocks[5].next_free_block is tail
    # Stable objects.
    assert queue.fake_free_list_head is head
    assert queue.fake_free_list_tail is tail


def test_empty_queue(FreeKVCacheBlockQueue):
    queue = FreeKVCacheBlockQueue([])
    assert queue.num_free_blocks == 0
    assert queue.get_all_free_blocks() == []
    assert queue.fake_free_list_head.next_free_block is queue.fake_free_list_tail
    assert queue.fake_free_list_tail.prev_free_block is queue.fake_free_list_head
    assert queue.popleft_n(0) == []
    queue.append_n([])
    assert queue.num_free_blocks == 0


def test_accepts_any_sequence(FreeKVCacheBlockQueue, KVCacheBlock):
    blocks = tuple(KVCacheBlock(i) for i in (5, 3, 9))
    queue = FreeKVCacheBlockQueue(blocks)
    assert ids(queue.get_all_free_blocks()) == [5, 3, 9]
    check_links(queue)


def test_non_contiguous_ids(FreeKVCacheBlockQueue, KVCacheBlock):
    blocks = [KVCacheBlock(i) for i in (100, 7, 0, 2**31 - 1)]
    queue = FreeKVCacheBlockQueue(blocks)
    assert queue.popleft() is blocks[0]
    queue.append(blocks[0])
    assert ids(queue.get_all_free_blocks()) == [7, 0, 2**31 - 1, 100]
    check_links(queue)


def test_popleft(queue, blocks):
    b = queue.popleft()
    assert b is blocks[0]
    assert b.prev_free_block is None and b.next_free_block is None
    assert queue.num_free_blocks == 5
    assert queue.fake_free_list_head.next_free_block is blocks[1]
    assert blocks[1].prev_free_block is queue.fake_free_list_head
    check_links(queue)


def test_popleft_until_empty(queue, blocks):
    assert [queue.popleft() for _ in range(6)] == blocks
    assert queue.num_free_blocks == 0
    assert queue.get_all_free_blocks() == []
    check_links(queue)
    with pytest.raises(ValueError, match="No free blocks available"):
        queue.popleft()


def test_popleft_n(queue, blocks):
    got = queue.popleft_n(4)
    assert got == blocks[:4]
    assert type(got) is list
    for b in got:
        assert b.prev_free_block is None and b.next_free_block is None
    assert queue.get_all_free_blocks() == blocks[4:]
    assert queue.popleft_n(0) == []
    assert queue.popleft_n(2) == blocks[4:]
    assert queue.num_free_blocks == 0
    check_links(queue)


def test_remove_middle_and_ends(queue, blocks):
    queue.remove(blocks[2])
    assert blocks[2].prev_free_block is None and blocks[2].next_free_block is None
    assert blocks[1].next_free_block is blocks[3]
    assert blocks[3].prev_free_block is blocks[1]
    queue.remove(blocks[0])
    queue.remove(blocks[5])
    assert queue.get_all_free_blocks() == [blocks[1], blocks[3], blocks[4]]
    assert queue.num_free_blocks == 3
    check_links(queue)


def test_remove_last_block(FreeKVCacheBlockQueue, KVCacheBlock):
    b = KVCacheBlock(0)
    queue = FreeKVCacheBlockQueue([b])
    queue.remove(b)
    assert queue.num_free_blocks == 0
    check_links(queue)
    queue.append(b)
    assert queue.get_all_free_blocks() == [b]
    check_links(queue)


def test_append_goes_to_tail(queue, blocks):
    b = queue.popleft()
    queue.append(b)
    assert queue.get_all_free_blocks() == blocks[1:] + [b]
    assert b.next_free_block is queue.fake_free_list_tail
    assert b.prev_free_block is blocks[5]
    check_links(queue)


def test_append_n_keeps_order(queue, blocks):
    popped = queue.popleft_n(4)
    queue.append_n(popped[::-1])
    assert ids(queue.get_all_free_blocks()) == [4, 5, 3, 2, 1, 0]
    assert queue.num_free_blocks == 6
    check_links(queue)


def test_append_n_accepts_a_tuple(queue, blocks):
    popped = queue.popleft_n(2)
    queue.append_n(tuple(popped))
    assert ids(queue.get_all_free_blocks()) == [2, 3, 4, 5, 0, 1]


def test_remove_then_append_middle(queue, blocks):
    queue.remove(blocks[3])
    queue.append(blocks[3])
    assert ids(queue.get_all_free_blocks()) == [0, 1, 2, 4, 5, 3]
    check_links(queue)


def test_queue_never_touches_ref_cnt_or_hash(FreeKVCacheBlockQueue, KVCacheBlock):
    blocks = [KVCacheBlock(i, ref_cnt=i, _block_hash=bytes([i])) for i in range(4)]
    blocks[2].is_null = True
    queue = FreeKVCacheBlockQueue(blocks)
    popped = queue.popleft_n(2)
    queue.remove(blocks[3])
    queue.append(blocks[3])
    queue.append_n(popped)
    assert ids(queue.get_all_free_blocks()) == [2, 3, 0, 1]
    # A null-flagged block is an ordinary member of a standalone queue.
    assert queue.popleft() is blocks[2]
    for i, b in enumerate(blocks):
        assert b.ref_cnt == i
        assert b.block_hash == bytes([i])
    assert blocks[2].is_null is True


def test_pool_queue(BlockPool):
    pool = BlockPool(6, True, 16)
    queue = pool.free_block_queue
    assert pool.free_block_queue is queue
    assert ids(queue.get_all_free_blocks()) == [1, 2, 3, 4, 5]
    assert queue.num_free_blocks == 5 == pool.get_num_free_blocks()
    check_links(queue)
    # The queue of a pool is usable directly (the pool's counts follow it).
    b = queue.popleft()
    assert b is pool.blocks[1]
    assert pool.get_num_free_blocks() == 4
    queue.append(b)
    assert ids(queue.get_all_free_blocks()) == [2, 3, 4, 5, 1]
    check_links(queue)


def test_pool_with_one_block_has_empty_queue(BlockPool):
    pool = BlockPool(1, True, 16)
    assert pool.free_block_queue.num_free_blocks == 0
    assert pool.free_block_queue.get_all_free_blocks() == []
    check_links(pool.free_block_queue)


# ---------------------------------------------------------------------------
# Differential: random operations against a plain list.

queue_ops = st.lists(
    st.one_of(
        st.tuples(st.just("popleft"), st.just(0)),
        st.tuples(st.just("popleft_n"), st.integers(0, 4)),
        st.tuples(st.just("remove"), st.integers(0, 7)),
        st.tuples(st.just("append"), st.integers(0, 7)),
        st.tuples(st.just("append_n"), st.lists(st.integers(0, 7), max_size=4, unique=True)),
    ),
    max_size=40,
)


@given(ops=queue_ops)
def test_queue_matches_list_model(FreeKVCacheBlockQueue, KVCacheBlock, ops):
    blocks = [KVCacheBlock(i) for i in range(8)]
    queue = FreeKVCacheBlockQueue(blocks)
    model = list(range(8))
    for op, arg in ops:
        if op == "popleft":
            if model:
                assert queue.popleft().block_id == model.pop(0)
        elif op == "popleft_n":
            if arg <= len(model):
                assert ids(queue.popleft_n(arg)) == model[:arg]
                del model[:arg]
        elif op == "remove":
            if arg in model:
                queue.remove(blocks[arg])
                model.remove(arg)
        elif op == "append":
            if arg not in model:
                queue.append(blocks[arg])
                model.append(arg)
        else:
            fresh = [i for i in arg if i not in model]
            queue.append_n([blocks[i] for i in fresh])
            model.extend(fresh)
        assert ids(queue.get_all_free_blocks()) == model
        assert queue.num_free_blocks == len(model)
    check_links(queue)
    for b in blocks:
        if b.block_id not in model:
            assert b.prev_free_block is None and b.next_free_block is None
