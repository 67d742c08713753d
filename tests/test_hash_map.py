"""BlockHashToBlockMap: the prefix-cache index."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from _helpers import key, make_hashes


def test_empty(BlockHashToBlockMap):
    m = BlockHashToBlockMap()
    assert len(m) == 0
    assert m.get_one_block(b"k") is None
    assert m.pop(b"k", 1) is None
    assert len(m) == 0


def test_insert_get_pop_single(BlockHashToBlockMap, KVCacheBlock):
    m = BlockHashToBlockMap()
    b = KVCacheBlock(4)
    m.insert(b"k", b)
    assert len(m) == 1
    assert m.get_one_block(b"k") is b
    assert m.get_one_block(b"other") is None
    # Wrong id: nothing removed.
    assert m.pop(b"k", 5) is None
    assert m.get_one_block(b"k") is b
    assert len(m) == 1
    assert m.pop(b"k", 4) is b
    assert len(m) == 0
    assert m.get_one_block(b"k") is None
    assert m.pop(b"k", 4) is None


def test_duplicate_keys_earliest_first(BlockHashToBlockMap, KVCacheBlock):
    m = BlockHashToBlockMap()
    a, b, c = KVCacheBlock(9), KVCacheBlock(2), KVCacheBlock(5)
    m.insert(b"k", a)
    m.insert(b"k", b)
    m.insert(b"k", c)
    assert len(m) == 1
    assert m.get_one_block(b"k") is a
    assert m.pop(b"k", 7) is None
    assert m.get_one_block(b"k") is a
    assert m.pop(b"k", 9) is a
    assert m.get_one_block(b"k") is b
    # Re-inserted: goes after the blocks still present.
    m.insert(b"k", a)
    assert m.get_one_block(b"k") is b
    assert m.pop(b"k", 2) is b
    assert m.get_one_block(b"k") is c
    assert m.pop(b"k", 5) is c
    assert m.get_one_block(b"k") is a
    assert len(m) == 1
    assert m.pop(b"k", 9) is a
    assert len(m) == 0
    assert m.get_one_block(b"k") is None


def test_pop_later_duplicate_keeps_first(BlockHashToBlockMap, KVCacheBlock):
    m = BlockHashToBlockMap()
    a, b = KVCacheBlock(1), KVCacheBlock(2)
    m.insert(b"k", a)
    m.insert(b"k", b)
    assert m.pop(b"k", 2) is b
    assert m.get_one_block(b"k") is a
    assert m.pop(b"k", 1) is a
    assert len(m) == 0


def test_len_counts_keys(BlockHashToBlockMap, KVCacheBlock):
    m = BlockHashToBlockMap()
    blocks = [KVCacheBlock(i) for i in range(6)]
    for i, b in enumerate(blocks):
        m.insert(bytes([i % 3]), b)
    assert len(m) == 3
    for i in range(3):
        assert m.get_one_block(bytes([i])) is blocks[i]


def test_same_block_under_two_keys(BlockHashToBlockMap, KVCacheBlock):
    m = BlockHashToBlockMap()
    b = KVCacheBlock(1)
    m.insert(b"x", b)
    m.insert(b"y", b)
    assert m.get_one_block(b"x") is b and m.get_one_block(b"y") is b
    assert m.pop(b"x", 1) is b
    assert m.get_one_block(b"y") is b


def test_map_never_touches_block_hash(BlockHashToBlockMap, KVCacheBlock):
    m = BlockHashToBlockMap()
    b = KVCacheBlock(1)
    m.insert(b"k", b)
    assert b.block_hash is None
    b.block_hash = b"other"
    m.pop(b"k", 1)
    assert b.block_hash == b"other"
    assert b.ref_cnt == 0


def test_real_keys_and_pool_blocks(BlockPool, BlockHashToBlockMap):
    pool = BlockPool(4, True, 16)
    m = BlockHashToBlockMap()
    hashes = make_hashes(3)
    for h, b in zip(hashes, pool.blocks[1:]):
        m.insert(key(h, 7), b)
    assert [m.get_one_block(key(h, 7)) for h in hashes] == pool.blocks[1:]
    assert m.get_one_block(key(hashes[0], 0)) is None
    # The pool's own map is untouched.
    assert len(pool.cached_block_hash_to_block) == 0


def test_pool_map_is_a_map(BlockPool, BlockHashToBlockMap):
    pool = BlockPool(3, True, 16)
    assert isinstance(pool.cached_block_hash_to_block, BlockHashToBlockMap)
    assert pool.cached_block_hash_to_block is pool.cached_block_hash_to_block


@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["insert", "pop", "get"]),
            st.sampled_from([b"a", b"b", b"c\x00\x00\x00\x01"]),
            st.integers(0, 5),
        ),
        max_size=60,
    )
)
def test_map_matches_model(BlockHashToBlockMap, KVCacheBlock, ops):
    m = BlockHashToBlockMap()
    blocks = [KVCacheBlock(i) for i in range(6)]
    model: dict[bytes, list[int]] = {}
    for op, k, block_id in ops:
        present = model.get(k, [])
        if op == "insert":
            if block_id in present:
                continue  # a block is never cached twice under one key
            m.insert(k, blocks[block_id])
            model.setdefault(k, []).append(block_id)
        elif op == "pop":
            got = m.pop(k, block_id)
            if block_id in present:
                assert got is blocks[block_id]
                present.remove(block_id)
                if not present:
                    del model[k]
            else:
                assert got is None
        first = model.get(k)
        assert m.get_one_block(k) is (blocks[first[0]] if first else None)
        assert len(m) == len(model)
