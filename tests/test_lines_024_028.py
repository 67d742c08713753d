"""The lines for vLLM 0.24.0-0.28.0 (``kvpool.v0_24``, ``v0_26``, ``v0_27``,
``v0_28``), on both cores: what each does differently from the next newer
line. The figures are those measured on each release's own pool
(``docs/lines-0.24-0.28.md``); ``tests/vllm_release`` compares the lines
with the releases' own code step by step.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import msgspec
import pytest

from _helpers import PlainRequest, event_hash, ids, key
from kvpool.vllm import vllm_line

LINES = ["v0_24", "v0_26", "v0_27", "v0_28"]
RELEASES = {
    "v0_24": ("0.24.0", "0.25.0", "0.25.1"),
    "v0_26": ("0.26.0",),
    "v0_27": ("0.27.0", "0.27.1"),
    "v0_28": ("0.28.0",),
}

_classes: dict[tuple[str, str], type] = {}


def line_module(line: str) -> ModuleType:
    return importlib.import_module(f"kvpool.{line}")


def pool_class(core: ModuleType, line: str) -> type:
    cls = _classes.get((line, core.__name__))
    if cls is None:
        cls = _classes[(line, core.__name__)] = line_module(line).make_block_pool_class(core)
    return cls


@pytest.mark.parametrize("line", LINES)
def test_registry(line: str) -> None:
    for release in RELEASES[line]:
        assert vllm_line(release).module == f"kvpool.{line}"
    assert line_module(line).BlockPool.__module__ == f"kvpool.{line}"


# -- free order ---------------------------------------------------------------

# After [1, 2, 3] of a 6-block pool are freed reversed, caching off; then the
# same with block 1 cached first (cache_full_blocks does not look at
# enable_caching, nor does get_new_blocks evict with caching off).
CACHING_OFF = {
    "v0_24": ([3, 2, 1, 4, 5], [3, 2, 4, 5, 1]),
    "v0_26": ([3, 2, 1, 4, 5], [3, 2, 4, 5, 1]),
    "v0_27": ([4, 5, 3, 2, 1], [4, 5, 3, 2, 1]),
    "v0_28": ([3, 2, 1, 4, 5], [3, 2, 1, 4, 5]),
}


@pytest.mark.parametrize("line", LINES)
def test_free_order_caching_off(core: ModuleType, line: str) -> None:
    for cached, expected in zip((False, True), CACHING_OFF[line]):
        pool = pool_class(core, line)(6, False, 4)
        blocks = pool.get_new_blocks(3)
        if cached:
            pool.cache_full_blocks(PlainRequest(3), blocks, 0, 1, 4, 0)
            assert blocks[0].block_hash is not None
        pool.free_blocks(reversed(blocks))
        assert ids(pool.free_block_queue.get_all_free_blocks()) == expected
        # Caching off, a reused block keeps its hash (nothing evicts it).
        pool.get_new_blocks(5)
        assert (pool.blocks[1].block_hash is not None) == cached


@pytest.mark.parametrize("line", LINES)
def test_free_order_caching_on(core: ModuleType, line: str) -> None:
    # The same in every release 0.24-0.33: uncached blocks in front.
    pool = pool_class(core, line)(10, True, 4)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(PlainRequest(3), blocks, 0, 2, 4, 0)
    pool.free_blocks(reversed(blocks))
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [3, 4, 5, 6, 7, 8, 9, 2, 1]
    more = pool.get_new_blocks(2)
    assert ids(more) == [3, 4]
    pool.free_blocks(reversed(more))
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [4, 3, 5, 6, 7, 8, 9, 2, 1]


@pytest.mark.parametrize("line", LINES)
def test_null_block_is_counted(core: ModuleType, line: str) -> None:
    pool = pool_class(core, line)(6, True, 4)
    null = pool.null_block
    pool.touch([null])
    assert null.ref_cnt == 1
    pool.free_blocks([null])
    pool.free_blocks([null])
    assert null.ref_cnt == -1
    assert pool.get_num_free_blocks() == 5


# -- API ----------------------------------------------------------------------

# (name, the lines that have it): 0.26 added the first two, 0.29 the last.
METHODS = [
    ("emit_cached_block_events", {"v0_26", "v0_27", "v0_28"}),
    ("move_block_hashes", {"v0_26", "v0_27", "v0_28"}),
    ("is_block_writable", set()),
]


@pytest.mark.parametrize("line", LINES)
def test_methods_of_the_release(core: ModuleType, line: str) -> None:
    cls = pool_class(core, line)
    pool = cls(6, True, 4)
    for name, lines in METHODS:
        assert hasattr(cls, name) == hasattr(pool, name) == (line in lines), name
    for name in ("medium", "unpin_blocks", "num_hash_lookahead_tokens"):
        assert not hasattr(pool, name), name  # 0.30 and later
    for name in ("cache_partial_block", "cached_block_hashes_by_block", "take_events"):
        assert hasattr(pool, name), name  # 0.24 and later
    with pytest.raises(TypeError):
        cls(6, True, 4, False, None, "GPU")  # no `medium` before 0.30


@pytest.mark.parametrize("line", LINES)
def test_module_names(line: str) -> None:
    module = line_module(line)
    media = {
        "v0_24": {"MEDIUM_GPU": "GPU"},
        "v0_26": {"MEDIUM_GPU": "GPU", "MEDIUM_CPU": "CPU", "MEDIUM_FS": "FS", "MEDIUM_OBJ": "OBJ"},
        "v0_27": {"MEDIUM_GPU": "GPU", "MEDIUM_CPU": "CPU", "MEDIUM_STORAGE": "STORAGE"},
        "v0_28": {"MEDIUM_GPU": "GPU", "MEDIUM_CPU": "CPU", "MEDIUM_STORAGE": "STORAGE"},
    }[line]
    exported = {name for name in module.__all__ if name.startswith("MEDIUM_")}
    assert exported == set(media)
    assert {name for name in dir(module) if name.startswith("MEDIUM_")} == set(media)
    assert {name: getattr(module, name) for name in media} == media
    assert ("resolve_block_hashes" in module.__all__) == (line != "v0_24")
    assert hasattr(module, "resolve_block_hashes") == (line != "v0_24")
    for name in module.__all__:
        assert hasattr(module, name), name
    for name in ("BlockPool", "make_block_pool_class", "KVCacheBlock", "FreeKVCacheBlockQueue",
                 "BlockHashToBlockMap", "BlockStored", "BlockRemoved", "AllBlocksCleared",
                 "KVEventBatch", "BlockHashListWithBlockSize"):
        assert name in module.__all__, name


# -- events -------------------------------------------------------------------

STORED_FIELDS_024 = (
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
    "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)


@pytest.mark.parametrize("line", LINES)
def test_event_fields(line: str) -> None:
    module = line_module(line)
    more = () if line == "v0_24" else ("locality",)  # 0.26 added it
    assert module.BlockStored.__struct_fields__ == STORED_FIELDS_024 + more
    assert module.BlockRemoved.__struct_fields__ == ("block_hashes", "medium", "group_idx") + more
    assert module.AllBlocksCleared.__struct_fields__ == ()
    for cls in (module.BlockStored, module.BlockRemoved, module.AllBlocksCleared):
        config = cls.__struct_config__
        assert (config.array_like, config.omit_defaults, config.tag) == (
            False, True, cls.__name__
        )
    assert module.KVEventBatch.__struct_config__.array_like
    # The pool queues the line's own classes.
    assert module.BlockPool._BlockStored is module.BlockStored
    assert module.BlockPool._BlockRemoved is module.BlockRemoved


@pytest.mark.parametrize("line", LINES)
def test_event_wire_format(core: ModuleType, line: str) -> None:
    """A pool's events are tagged maps with the defaults left out: the same
    bytes in every line (``locality`` is never set by a pool)."""
    pool = pool_class(core, line)(10, True, 4, enable_kv_cache_events=True)
    request = PlainRequest(3)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(request, blocks, 0, 2, 4, 1)
    pool.free_blocks(reversed(blocks))
    pool.get_new_blocks(9)  # evicts blocks 2 and 1
    events = pool.take_events()
    decoded = msgspec.msgpack.decode(msgspec.msgpack.encode(events))
    h = [event_hash(x) for x in request.block_hashes]
    assert [list(event.items()) for event in decoded] == [
        [
            ("type", "BlockStored"),
            ("block_hashes", h[:2]),
            ("parent_block_hash", None),
            ("token_ids", list(range(100, 108))),
            ("block_size", 4),
            ("lora_id", None),
            ("medium", "GPU"),
            ("lora_name", None),
            ("extra_keys", [None, None]),  # one entry per block, as vLLM's
            ("group_idx", 1),
        ],
        [("type", "BlockRemoved"), ("block_hashes", [h[1]]), ("medium", "GPU"), ("group_idx", 1)],
        [("type", "BlockRemoved"), ("block_hashes", [h[0]]), ("medium", "GPU"), ("group_idx", 1)],
    ]
    assert pool.cached_block_hash_to_block.get_one_block(key(request.block_hashes[0], 1)) is None


@pytest.mark.parametrize("line", ["v0_26", "v0_27", "v0_28"])
def test_emit_cached_block_events(core: ModuleType, line: str) -> None:
    pool = pool_class(core, line)(10, True, 4, enable_kv_cache_events=True)
    request = PlainRequest(3)
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(request, blocks, 0, 2, 4, 0)
    pool.take_events()
    pool.emit_cached_block_events(request, 2, 4, 0)
    (event,) = pool.take_events()
    assert isinstance(event, line_module(line).BlockStored)
    assert event.block_hashes == [event_hash(x) for x in request.block_hashes[:2]]
    assert event.parent_block_hash is None and event.locality is None


@pytest.mark.parametrize("line", LINES)
def test_event_hash_is_vllms(line: str) -> None:
    """vLLM's ``__hash__`` fields: all but ``lora_name``, with ``locality``
    from 0.26 (events are counted across workers by hash)."""
    module = line_module(line)
    a = module.BlockStored([1], None, [1, 2], 2, None, "GPU", "x", extra_keys=[("k",)])
    b = module.BlockStored([1], None, [1, 2], 2, None, "GPU", "y", extra_keys=[("k",)])
    assert hash(a) == hash(b)
    expected = ((1,), None, (1, 2), 2, None, "GPU", (("k",),), None, None, None)
    if line != "v0_24":
        expected += (None,)
    assert hash(a) == hash(expected)
    removed = module.BlockRemoved([7], "GPU", group_idx=3)
    assert hash(removed) == hash(((7,), "GPU", 3) + (() if line == "v0_24" else (None,)))
