"""The vLLM 0.17-0.23 lines (API generations G2-G6): what each changed over
the line before, on both cores. The per-release proof against vLLM's own
pools is ``tests/vllm_release``; these tests pin each difference down
without vLLM, decoding the events' msgpack arrays field by field."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

import msgpack
import msgspec
import pytest

from _helpers import event_hash, ids, key, make_hashes

LINES = ("v0_17", "v0_18", "v0_19", "v0_20", "v0_22", "v0_23")
GPU = "GPU"

_classes: dict[tuple[str, str], type] = {}


def pool_class(line: str, core: ModuleType) -> type:
    cls = _classes.get((line, core.__name__))
    if cls is None:
        module = importlib.import_module(f"kvpool.{line}")
        cls = _classes[(line, core.__name__)] = module.make_block_pool_class(core)
    return cls


class Pos:
    def __init__(self, offset: int, length: int) -> None:
        self.offset, self.length = offset, length


class Feature:
    def __init__(self, identifier: str, offset: int, length: int) -> None:
        self.identifier, self.mm_position = identifier, Pos(offset, length)


class Lora:
    def __init__(self, adapter_id: int, name: str) -> None:
        self.adapter_id, self.name, self.lora_name = adapter_id, name, name


class Request:
    """What the pools of these lines read of a vLLM ``Request``."""

    def __init__(self, n_blocks: int, lora: Lora | None = None, mm=(), salt=None) -> None:
        self.block_hashes = make_hashes(n_blocks, tag=b"g2g6")
        self.all_token_ids = list(range(100, 100 + 4 * n_blocks))
        self.lora_request = lora
        self.mm_features = list(mm)
        self.cache_salt = salt
        self.prompt_embeds = None
        self._prompt_embeds_per_block_hashes: dict[Any, bytes] = {}


def decoded(events: list[Any]) -> list[list[Any]]:
    return [msgpack.unpackb(msgspec.msgpack.encode(e)) for e in events]


def cached_pool(line: str, core: ModuleType, request: Request, group: int = 0, **kw):
    """A 10-block pool (hash block size 4, events on) that cached all
    blocks of ``request``; returns the pool, its blocks and the events."""
    n = len(request.block_hashes)
    pool = pool_class(line, core)(10, True, 4, enable_kv_cache_events=True)
    blocks = pool.get_new_blocks(n)
    pool.cache_full_blocks(request, blocks, 0, n, 4, group, **kw)
    return pool, blocks, pool.take_events()


@pytest.mark.parametrize("line", LINES)
def test_line_exports(line: str, core: ModuleType) -> None:
    module = importlib.import_module(f"kvpool.{line}")
    for name in (
        "BlockPool", "make_block_pool_class", "KVCacheBlock", "FreeKVCacheBlockQueue",
        "BlockHashToBlockMap", "BlockStored", "BlockRemoved", "AllBlocksCleared",
    ):
        assert name in module.__all__ and hasattr(module, name), name
    cls = pool_class(line, core)
    assert cls.__name__ == "BlockPool" and issubclass(cls, core.PoolCore)
    assert cls._BlockStored is module.BlockStored and cls._BlockRemoved is module.BlockRemoved


def test_0_17_plain_request_stores_a_none_per_block(core: ModuleType) -> None:
    # vLLM lists a None per stored block; the null block is skipped, as its hash.
    request = Request(3)
    pool = pool_class("v0_17", core)(10, True, 4, enable_kv_cache_events=True)
    a, b = pool.get_new_blocks(2)
    pool.cache_full_blocks(request, [a, pool.null_block, b], 0, 3, 4, 0)
    h = [event_hash(x) for x in request.block_hashes]
    assert decoded(pool.take_events()) == [
        ["BlockStored", [h[0], h[2]], None, request.all_token_ids[:12], 4, None, GPU, None,
         [None, None]]
    ]
    assert a.block_hash == key(request.block_hashes[0]) and b.block_hash == key(request.block_hashes[2])


def test_0_15_has_no_extra_keys_field(core: ModuleType) -> None:
    _, _, events = cached_pool("v0_17", core, Request(2))
    from kvpool import BlockPool  # noqa: F401 -- the 0.15 line
    from kvpool.block_pool import make_block_pool_class

    pool = make_block_pool_class(core)(10, True, 4, enable_kv_cache_events=True)
    pool.cache_full_blocks(Request(2), pool.get_new_blocks(2), 0, 2, 4, 0)
    assert len(decoded(pool.take_events())[0]) == len(decoded(events)[0]) - 1


def test_lora_and_cache_salt_keys(core: ModuleType) -> None:
    request = Request(2, lora=Lora(7, "ad"), salt="salt")
    _, _, events = cached_pool("v0_17", core, request)
    (event,) = decoded(events)
    assert event[5:9] == [7, GPU, "ad", [["ad", "salt"], ["ad"]]]


# An item over tokens [2, 8) and one over [8, 10): block 1 ([4, 8)) holds the
# end of the first; block 2 ([8, 12)) starts where the first ends.
MM = [Feature("img", 2, 6), Feature("snd", 8, 2)]


def mm_events(line: str, core: ModuleType) -> list[list[Any]]:
    """The extra keys of two ``cache_full_blocks`` calls: blocks 0-1, then
    block 2 (vLLM walks the items from the first again in each call)."""
    pool = pool_class(line, core)(10, True, 4, enable_kv_cache_events=True)
    request = Request(3, mm=MM)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(request, blocks, 0, 2, 4, 0)
    pool.cache_full_blocks(request, blocks, 2, 3, 4, 0)
    return [event[8] for event in decoded(pool.take_events())]


def test_0_17_multimodal_keys_are_identifiers_and_touching_items_count(core: ModuleType) -> None:
    assert mm_events("v0_18", core) == [[["img"], ["img"]], [["img", "snd"]]]


def test_0_19_multimodal_keys_carry_the_offset_in_the_block(core: ModuleType) -> None:
    assert mm_events("v0_19", core) == [[[["img", 2]], [["img", -2]]], [[["snd", 0]]]]


def test_feature_without_identifier_raises(core: ModuleType) -> None:
    pool = pool_class("v0_19", core)(10, True, 4, enable_kv_cache_events=True)
    with pytest.raises(ValueError, match="identifier"):
        pool.cache_full_blocks(Request(1, mm=[Feature(None, 0, 2)]), pool.get_new_blocks(1), 0, 1, 4, 0)


@pytest.mark.parametrize("line", ["v0_19", "v0_20"])
def test_group_idx_from_0_20(line: str, core: ModuleType) -> None:
    request = Request(2)
    pool, blocks, events = cached_pool(line, core, request, group=5)
    pool.free_blocks(reversed(blocks))
    pool.get_new_blocks(9)  # evicts both, the request's tail first
    removed = decoded(pool.take_events())
    h = [event_hash(x) for x in request.block_hashes]
    if line == "v0_19":
        assert len(decoded(events)[0]) == 9
        assert removed == [["BlockRemoved", [h[1]], GPU], ["BlockRemoved", [h[0]], GPU]]
    else:
        assert decoded(events)[0][9] == 5
        assert removed == [["BlockRemoved", [h[1]], GPU, 5], ["BlockRemoved", [h[0]], GPU, 5]]


def test_0_20_event_hash_covers_group_idx() -> None:
    from kvpool.v0_20 import BlockRemoved, BlockStored

    assert hash(BlockRemoved([1], GPU, 0)) != hash(BlockRemoved([1], GPU, 1))
    stored = [BlockStored([1], None, [0], 4, None, GPU, None, None, g) for g in (0, 1)]
    assert len(set(stored)) == 2


def test_0_22_spec_fields_default_to_none(core: ModuleType) -> None:
    _, _, events = cached_pool("v0_22", core, Request(1))
    assert decoded(events)[0][9:] == [0, None, None]


def test_0_22_block_mask_skips_blocks(core: ModuleType) -> None:
    request = Request(4, mm=[Feature("img", 0, 16)])
    pool, blocks, events = cached_pool("v0_22", core, request, block_mask=[True, False, False, True])
    assert [b.block_hash for b in blocks] == [
        key(request.block_hashes[0]), None, None, key(request.block_hashes[3])
    ]
    assert len(pool.cached_block_hash_to_block) == 2
    (event,) = decoded(events)
    assert event[1] == [event_hash(request.block_hashes[0]), event_hash(request.block_hashes[3])]
    # Each stored block's own keys: the image starts 12 tokens before block 3.
    assert event[8] == [[["img", 0]], [["img", -12]]]


def test_0_22_block_mask_of_the_wrong_length_changes_nothing(core: ModuleType) -> None:
    pool = pool_class("v0_22", core)(10, True, 4, enable_kv_cache_events=True)
    blocks = pool.get_new_blocks(3)
    with pytest.raises(ValueError, match="block_mask"):
        pool.cache_full_blocks(Request(3), blocks, 0, 3, 4, 0, block_mask=[True, True])
    assert [b.block_hash for b in blocks] == [None] * 3 and pool.take_events() == []


def test_0_23_free_blocks_prepend(core: ModuleType) -> None:
    pool = pool_class("v0_23", core)(10, True, 4)
    a, b, c, d = pool.get_new_blocks(4)
    pool.touch([d])
    pool.free_blocks([a, pool.null_block, b, d], prepend=True)  # d keeps a reference
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [1, 2, 5, 6, 7, 8, 9]
    pool.free_blocks([c, d])
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [1, 2, 5, 6, 7, 8, 9, 3, 4]
    assert [blk.block_id for blk in pool.get_new_blocks(2)] == [1, 2]


def test_0_23_bad_prepend_free_changes_nothing(core: ModuleType) -> None:
    pool = pool_class("v0_23", core)(10, True, 4)
    a, b = pool.get_new_blocks(2)
    pool.free_blocks([a])
    before = ids(pool.free_block_queue.get_all_free_blocks())
    with pytest.raises(ValueError):
        pool.free_blocks(iter([b, a]), prepend=True)  # a: double free
    assert ids(pool.free_block_queue.get_all_free_blocks()) == before and b.ref_cnt == 1


def test_0_22_has_no_prepend(core: ModuleType) -> None:
    pool = pool_class("v0_22", core)(4, True, 4)
    with pytest.raises(TypeError):
        pool.free_blocks([], prepend=True)


@pytest.mark.parametrize("line", ["v0_19", "v0_23"])
def test_block_hash_written_directly_as_the_offload_connector_does(line: str, core: ModuleType) -> None:
    # SimpleCPUOffload: stamp blocks fresh from get_new_blocks, insert them
    # into the map later, then free them into the prefix cache.
    pool = pool_class(line, core)(4, True, 4)
    blocks = pool.get_new_blocks(2)
    stamps = [key(h) for h in make_hashes(2, tag=b"cpu")]
    for block, stamp in zip(blocks, stamps):
        block._block_hash = stamp
    for block in blocks:
        pool.cached_block_hash_to_block.insert(block.block_hash, block)
    pool.free_blocks(blocks)
    assert pool.get_cached_block(stamps[1][:-4], [0]) == [blocks[1]]
    assert [b._block_hash for b in blocks] == stamps
    with pytest.raises(RuntimeError, match="already has a hash"):
        blocks[0]._block_hash = stamps[1]  # would relabel a cached block
    assert blocks[0].block_hash == stamps[0]
