"""The lines of vLLM 0.29.0-0.32.0 (``kvpool.v0_29`` ... ``kvpool.v0_32``)
over both cores: each line's differences from the next newer one, as the
releases' own code has them.

The exact agreement with each release's own pool is proven by the
per-release differential harness (run in the vLLM environment, with the
release's tree on ``PYTHONPATH``); these tests pin the differences down
without vLLM.
"""

from __future__ import annotations

import importlib
import inspect
from types import ModuleType, SimpleNamespace
from typing import Any

import msgspec
import pytest

from _helpers import check_raises, hash_chain, ids, key
from kvpool.v0_33.block_pool import PoolArgumentError

LINES = ["0.29", "0.30", "0.31", "0.32"]
_classes: dict[tuple[str, str], type] = {}


def line_module(line: str) -> ModuleType:
    return importlib.import_module(f"kvpool.v0_{line[2:]}")


def pool_class(line: str, core: ModuleType) -> type:
    cls = _classes.get((line, core.__name__))
    if cls is None:
        cls = _classes[(line, core.__name__)] = line_module(line).make_block_pool_class(core)
    return cls


class Req:
    """What the pool reads of a vLLM ``Request`` (0.29's has no session_id)."""

    def __init__(self, hashes: list[bytes], block_size: int = 4, **kw: Any) -> None:
        self.block_hashes = hashes
        self.all_token_ids = list(range(len(hashes) * block_size))
        self.lora_request = kw.pop("lora_request", None)
        self.mm_features = kw.pop("mm_features", [])
        self.cache_salt = kw.pop("cache_salt", None)
        self.prompt_embeds = None
        self.session_id = kw.pop("session_id", None)
        assert not kw, kw


def mm(identifier: str, offset: int, length: int) -> Any:
    return SimpleNamespace(
        identifier=identifier, mm_position=SimpleNamespace(offset=offset, length=length)
    )


@pytest.mark.parametrize("line", LINES)
def test_free_order_and_null_count(core: ModuleType, line: str) -> None:
    # shared/VLLM-VERSIONS.md, "Free-queue order, measured": the 0.28.0-0.32.0
    # row, null ref_cnt 1 after a touch and -1 after touch + free + free.
    Pool = pool_class(line, core)
    pool = Pool(10, True, 4)
    a = pool.get_new_blocks(3)
    b = pool.get_new_blocks(2)
    pool.cache_full_blocks(Req(hash_chain([1, 2])), a, 0, 2, 4, 0)
    pool.free_blocks(reversed(a))
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [3, 6, 7, 8, 9, 2, 1]
    pool.free_blocks(reversed(b))
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [5, 4, 3, 6, 7, 8, 9, 2, 1]
    off = Pool(6, False, 4)
    c = off.get_new_blocks(3)
    off.free_blocks(reversed(c))
    assert ids(off.free_block_queue.get_all_free_blocks()) == [3, 2, 1, 4, 5]
    null = off.null_block
    off.touch([null])
    assert null.ref_cnt == 1
    off.free_blocks([null])
    off.free_blocks([null])
    assert null.ref_cnt == -1
    assert off.get_num_free_blocks() == 5 and null not in off.free_block_queue.get_all_free_blocks()


@pytest.mark.parametrize("line", LINES)
def test_constructor_as_the_coordinator_calls_it(core: ModuleType, line: str) -> None:
    Pool = pool_class(line, core)
    # Every release's KVCacheCoordinator passes these five by keyword.
    pool = Pool(
        num_gpu_blocks=5,
        enable_caching=True,
        hash_block_size=4,
        enable_kv_cache_events=True,
        metrics_collector=None,
    )
    assert not hasattr(pool, "num_hash_lookahead_tokens")
    check_raises(TypeError, Pool, 5, True, 4, num_hash_lookahead_tokens=0)
    params = list(inspect.signature(Pool.__init__).parameters)
    if line == "0.29":
        assert params[1:] == [
            "num_gpu_blocks", "enable_caching", "hash_block_size",
            "enable_kv_cache_events", "metrics_collector",
        ]
        assert not hasattr(pool, "medium") and not hasattr(Pool, "medium")
        check_raises(TypeError, Pool, 5, True, 4, False, None, "CPU")
    else:
        # No num_hash_lookahead_tokens: the medium is the 6th positional.
        assert params[6] == "medium"
        assert pool.medium == "GPU"
        assert Pool(5, True, 4, False, None, "CPU").medium == "CPU"


@pytest.mark.parametrize("line", LINES)
def test_block_stored_fields_and_bytes(core: ModuleType, line: str) -> None:
    m = line_module(line)
    fields = m.BlockStored.__struct_fields__
    assert "lookahead_token_ids" not in fields
    assert ("session_id" in fields) == (line != "0.29")
    medium = "GPU" if line == "0.29" else "CPU"
    Pool = pool_class(line, core)
    pool = Pool(6, True, 4, True) if line == "0.29" else Pool(6, True, 4, True, medium=medium)
    hashes = hash_chain([1, 2])
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(Req(hashes, session_id="s1"), blocks, 0, 2, 4, 0)
    pool.evict_blocks([blocks[1].block_id])
    stored, removed = pool.take_events()
    assert type(stored) is m.BlockStored
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode([stored, removed]))
    expected_stored = {
        "type": "BlockStored",
        "block_hashes": stored.block_hashes,
        "parent_block_hash": None,
        "token_ids": list(range(8)),
        "block_size": 4,
        "lora_id": None,
        "medium": medium,
        "lora_name": None,
        "extra_keys": [None, None],
        "group_idx": 0,
    }
    if line != "0.29":
        expected_stored["session_id"] = "s1"
    assert decoded == [
        expected_stored,
        {"type": "BlockRemoved", "block_hashes": [stored.block_hashes[1]], "medium": medium,
         "group_idx": 0},
    ]
    assert stored == msgspec.msgpack.decode(msgspec.msgpack.encode(stored), type=m.BlockStored)


@pytest.mark.parametrize("line", LINES)
def test_unpin_blocks_from_0_30(core: ModuleType, line: str) -> None:
    pool = pool_class(line, core)(6, True, 4)
    if line == "0.29":
        assert not hasattr(pool, "unpin_blocks")
        check_raises(AttributeError, getattr, pool_class(line, core), "unpin_blocks")
        return
    seen: list[int] = []
    blocks = pool.get_new_blocks(2)
    pool.unpin_blocks(blocks, lambda b: seen.append(b.block_id))
    assert pool.get_num_free_blocks() == 5
    pool.get_new_blocks(5)
    assert sorted(seen) == [1, 2]


@pytest.mark.parametrize("line", LINES)
def test_cache_partial_block_rules(core: ModuleType, line: str) -> None:
    Pool = pool_class(line, core)
    hashes = hash_chain([1, 2, 3, 4])
    req = Req(hashes)
    pool = Pool(6, True, 4)
    (blk,) = pool.get_new_blocks(1)
    # A partial entry inside an 8-token block: every release.
    assert pool.cache_partial_block(req, blk, 4, 0, 8) == key(hashes[0])
    params = inspect.signature(Pool.cache_partial_block).parameters
    assert ("replace_existing_hashes" in params) == (line != "0.29")
    # An entry at the block's end (num_tokens a multiple of block_size), or a
    # block_size equal to hash_block_size: 0.29-0.31 assert it is partial.
    for args in ((8, 0, 8), (4, 0, 4)):
        (other,) = pool.get_new_blocks(1)
        if line == "0.32":
            assert pool.cache_partial_block(req, other, *args) is not None
        else:
            check_raises(PoolArgumentError, pool.cache_partial_block, req, other, *args)
            assert other.block_hash is None
            if line != "0.29":  # unless the block's contents are replaced
                pool.cache_partial_block(req, other, *args, replace_existing_hashes=True)
                assert other.block_hash is not None


@pytest.mark.parametrize("line", LINES)
def test_partial_block_event_multimodal_items(core: ModuleType, line: str) -> None:
    # Two images inside the second 8-token block, partial at token 14: 0.31
    # finds the first item overlapping the block, 0.29 and 0.30 start from the
    # last.
    Pool = pool_class(line, core)
    pool = Pool(6, True, 2, True)
    hashes = hash_chain(list(range(8)))
    req = Req(hashes, block_size=2, mm_features=[mm("a", 9, 2), mm("b", 12, 2)])
    blocks = pool.get_new_blocks(2)
    pool.cache_partial_block(req, blocks[1], 14, 0, 8)
    (event,) = pool.take_events()
    assert event.token_ids == [12, 13] and event.block_size == 2
    # The partial event covers the last hash block [12, 14) of the prefix.
    assert event.extra_keys == [(("b", 0),)]
    pool2 = Pool(6, True, 2, True)
    b2 = pool2.get_new_blocks(2)
    req2 = Req(hashes, block_size=2, mm_features=[mm("a", 11, 2), mm("b", 13, 2)])
    pool2.cache_partial_block(req2, b2[1], 14, 0, 8)
    (event2,) = pool2.take_events()
    if line in ("0.29", "0.30"):
        assert event2.extra_keys == [(("b", 1),)]
    else:
        assert event2.extra_keys == [(("a", -1), ("b", 1))]


def test_extra_key_helpers_per_release() -> None:
    lora = SimpleNamespace(lora_name="ad", lora_path="/p", adapter_id=3, name="ad")
    req = Req(hash_chain([1]), lora_request=lora, cache_salt="salt", mm_features=[mm("i", 1, 2)])
    tagged = (("lora", "ad", "/p"), ("mm", "i", 1), ("cache_salt", "salt"))
    plain = ("ad", ("i", 1), "salt")
    for line in ("0.31", "0.32"):
        assert line_module(line).generate_block_hash_extra_keys(req, 0, 4, 0) == (tagged, 1)
    for line in ("0.29", "0.30"):
        m = line_module(line)
        assert m.generate_block_hash_extra_keys(req, 0, 4, 0) == (plain, 1)
        assert not hasattr(m, "to_event_extra_keys")
    assert line_module("0.31").to_event_extra_keys([tagged]) == [plain]
    for line in LINES:
        assert not hasattr(line_module(line), "generate_lookahead_block_hash_extra_keys")


@pytest.mark.parametrize("line", LINES)
def test_module_exports(core: ModuleType, line: str) -> None:
    m = line_module(line)
    for name in m.__all__:
        assert hasattr(m, name), name
    for name in ("BlockPool", "make_block_pool_class", "KVCacheBlock", "FreeKVCacheBlockQueue",
                 "BlockHashToBlockMap", "BlockStored", "BlockRemoved", "AllBlocksCleared",
                 "KVEventBatch"):
        assert name in m.__all__, name
    Pool = pool_class(line, core)
    assert Pool.__module__ == f"kvpool.v0_{line[2:]}" and Pool.__qualname__ == "BlockPool"
    assert Pool._BlockStored is m.BlockStored
    assert Pool._BlockRemoved is m.BlockRemoved and Pool._AllBlocksCleared is m.AllBlocksCleared
    assert "Drop-in for vLLM " + line in (Pool.__doc__ or "")


def test_registry_rows() -> None:
    from kvpool.vllm import vllm_line

    for line in LINES:
        entry = vllm_line(line + ".0")
        assert (entry.name, entry.releases, entry.module) == (
            line, (line + ".0",), f"kvpool.v0_{line[2:]}"
        )
