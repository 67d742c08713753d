"""KV-cache events: the wire format must be byte-identical to vLLM 0.15.1's.

The expected bytes are written out by hand from the msgpack spec: a tagged
``array_like`` struct is an array whose first item is the tag (the class
name), then the fields in declaration order. ``omit_defaults`` has no effect
on ``array_like`` structs (msgspec issue #720): every field is encoded, so a
batch ends with ``data_parallel_rank`` even when it is ``None`` (nil, 0xc0).
vLLM 0.15.1 uses the same struct options, so its batches carry that nil too;
``test_same_bytes_as_vllm_structs`` checks against vLLM's definitions.
"""

import msgpack
import msgspec
import pytest

from kvpool import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVEventBatch,
    MEDIUM_GPU,
)

from _helpers import FakeLoRARequest, FakeRequest, block_pool_class

GPU = b"\xa3GPU"  # fixstr(3) "GPU"
TAG_STORED = b"\xabBlockStored"  # fixstr(11)
TAG_REMOVED = b"\xacBlockRemoved"  # fixstr(12)
TAG_CLEARED = b"\xb0AllBlocksCleared"  # fixstr(16)

# 32-byte hashes whose low 64 bits are 1, 0xDEADBEEF and 0x8000000000000005:
# a positive fixint, a uint32 and a uint64 on the wire.
H0 = b"\x11" * 24 + (1).to_bytes(8, "big")
H1 = b"\x22" * 24 + (0xDEADBEEF).to_bytes(8, "big")
H2 = b"\xaa" * 24 + (0x8000000000000005).to_bytes(8, "big")


def run_known_sequence(BlockPool):
    """A fixed sequence of pool calls covering every event type."""
    pool = BlockPool(4, True, 2, enable_kv_cache_events=True)
    request = FakeRequest([H0, H1, H2], [1, 2, 3, 4, 5, 6], FakeLoRARequest(3, "ab"))
    blocks = pool.get_new_blocks(3)  # ids 1, 2, 3
    pool.cache_full_blocks(request, blocks, 0, 2, 2, 0)  # BlockStored H0, H1
    pool.cache_full_blocks(request, blocks, 2, 3, 2, 0)  # BlockStored H2, parent H1
    pool.free_blocks(reversed(blocks))  # queue: 3, 2, 1
    (reused,) = pool.get_new_blocks(1)  # block 3: BlockRemoved H2
    pool.free_blocks([reused])
    pool.evict_blocks([1])  # BlockRemoved H0
    assert pool.reset_prefix_cache()  # AllBlocksCleared
    return pool.take_events()


KNOWN_SEQUENCE_BYTES = b"".join(
    [
        b"\x93",  # KVEventBatch: [ts, events, data_parallel_rank]
        b"\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00",  # float64 1.5
        b"\x95",  # five events
        # BlockStored(block_hashes=[1, 0xDEADBEEF], parent=None, tokens=[1, 2, 3, 4],
        #             block_size=2, lora_id=3, medium="GPU", lora_name="ab")
        b"\x98" + TAG_STORED,
        b"\x92\x01\xce\xde\xad\xbe\xef",
        b"\xc0",
        b"\x94\x01\x02\x03\x04",
        b"\x02",
        b"\x03",
        GPU,
        b"\xa2ab",
        # BlockStored([0x8000000000000005], parent=0xDEADBEEF, [5, 6], 2, 3, "GPU", "ab")
        b"\x98" + TAG_STORED,
        b"\x91\xcf\x80\x00\x00\x00\x00\x00\x00\x05",
        b"\xce\xde\xad\xbe\xef",
        b"\x92\x05\x06",
        b"\x02",
        b"\x03",
        GPU,
        b"\xa2ab",
        # BlockRemoved([0x8000000000000005], "GPU")
        b"\x93" + TAG_REMOVED,
        b"\x91\xcf\x80\x00\x00\x00\x00\x00\x00\x05",
        GPU,
        # BlockRemoved([1], "GPU")
        b"\x93" + TAG_REMOVED,
        b"\x91\x01",
        GPU,
        # AllBlocksCleared()
        b"\x91" + TAG_CLEARED,
        b"\xc0",  # data_parallel_rank=None
    ]
)


def test_known_sequence_exact_bytes(BlockPool, monkeypatch):
    monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
    events = run_known_sequence(BlockPool)
    encoded = msgspec.msgpack.encode(KVEventBatch(ts=1.5, events=events))
    assert encoded == KNOWN_SEQUENCE_BYTES


def test_known_sequence_matches_independent_encoder(BlockPool, monkeypatch):
    # The same structure as plain lists through the msgpack package.
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")
    events = run_known_sequence(BlockPool)
    plain = [
        1.5,
        [
            ["BlockStored", [1, 0xDEADBEEF], None, [1, 2, 3, 4], 2, 3, "GPU", "ab"],
            ["BlockStored", [0x8000000000000005], 0xDEADBEEF, [5, 6], 2, 3, "GPU", "ab"],
            ["BlockRemoved", [0x8000000000000005], "GPU"],
            ["BlockRemoved", [1], "GPU"],
            ["AllBlocksCleared"],
        ],
        None,
    ]
    assert msgpack.packb(plain) == KNOWN_SEQUENCE_BYTES
    assert msgspec.msgpack.encode(KVEventBatch(ts=1.5, events=events)) == msgpack.packb(plain)


def test_known_sequence_decodes(BlockPool, monkeypatch):
    monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
    events = run_known_sequence(BlockPool)
    batch = msgspec.msgpack.Decoder(KVEventBatch).decode(KNOWN_SEQUENCE_BYTES)
    assert batch == KVEventBatch(ts=1.5, events=events)
    assert batch.data_parallel_rank is None
    assert [type(e) for e in batch.events] == [
        BlockStored,
        BlockStored,
        BlockRemoved,
        BlockRemoved,
        AllBlocksCleared,
    ]


def run_raw_sequence(BlockPool):
    pool = BlockPool(3, True, 1, enable_kv_cache_events=True)
    request = FakeRequest([b"\x01\x02", b"\xff"], [7, 8])
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(request, blocks, 0, 2, 1, 0)
    pool.evict_blocks([2])
    return pool.take_events()


def test_raw_byte_hashes_exact_bytes(BlockPool, monkeypatch):
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    events = run_raw_sequence(BlockPool)
    encoded = msgspec.msgpack.encode(KVEventBatch(ts=0.0, events=events, data_parallel_rank=1))
    assert encoded == b"".join(
        [
            b"\x93",  # [ts, events, data_parallel_rank]
            b"\xcb\x00\x00\x00\x00\x00\x00\x00\x00",
            b"\x92",
            b"\x98" + TAG_STORED,
            b"\x92\xc4\x02\x01\x02\xc4\x01\xff",  # bin8 hashes
            b"\xc0",
            b"\x92\x07\x08",
            b"\x01",
            b"\xc0",
            GPU,
            b"\xc0",
            b"\x93" + TAG_REMOVED,
            b"\x91\xc4\x01\xff",
            GPU,
            b"\x01",
        ]
    )
    assert events[0].block_hashes == [b"\x01\x02", b"\xff"]


def test_int_hashes_same_sequence(BlockPool, monkeypatch):
    monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
    events = run_raw_sequence(BlockPool)
    encoded = msgspec.msgpack.encode(KVEventBatch(ts=0.0, events=events, data_parallel_rank=1))
    assert encoded == b"".join(
        [
            b"\x93",
            b"\xcb\x00\x00\x00\x00\x00\x00\x00\x00",
            b"\x92",
            b"\x98" + TAG_STORED,
            b"\x92\xcd\x01\x02\xcc\xff",  # uint16 258, uint8 255
            b"\xc0",
            b"\x92\x07\x08",
            b"\x01",
            b"\xc0",
            GPU,
            b"\xc0",
            b"\x93" + TAG_REMOVED,
            b"\x91\xcc\xff",
            GPU,
            b"\x01",
        ]
    )
    assert events[0].block_hashes == [0x0102, 0xFF]


def test_parent_hash_raw_bytes(BlockPool, monkeypatch):
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    pool = BlockPool(4, True, 16, enable_kv_cache_events=True)
    hashes = [H0, H1]
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(FakeRequest(hashes), blocks, 0, 1, 16, 0)
    pool.cache_full_blocks(FakeRequest(hashes), blocks, 1, 2, 16, 0)
    first, second = pool.take_events()
    assert first.parent_block_hash is None
    assert second.parent_block_hash == H0
    assert second.block_hashes == [H1]


def test_single_events_exact_bytes():
    assert msgspec.msgpack.encode(BlockRemoved(block_hashes=[5], medium="GPU")) == (
        b"\x93" + TAG_REMOVED + b"\x91\x05" + GPU
    )
    assert msgspec.msgpack.encode(AllBlocksCleared()) == b"\x91" + TAG_CLEARED
    assert msgspec.msgpack.encode(KVEventBatch(ts=1.5, events=[])) == (
        b"\x93\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00\x90\xc0"
    )
    assert msgspec.msgpack.encode(KVEventBatch(ts=1.5, events=[], data_parallel_rank=2)) == (
        b"\x93\xcb\x3f\xf8\x00\x00\x00\x00\x00\x00\x90\x02"
    )


def test_struct_layout():
    fields = [f.name for f in msgspec.structs.fields(BlockStored)]
    assert fields == [
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
    ]
    assert [f.name for f in msgspec.structs.fields(BlockRemoved)] == ["block_hashes", "medium"]
    assert [f.name for f in msgspec.structs.fields(AllBlocksCleared)] == []
    assert [f.name for f in msgspec.structs.fields(KVEventBatch)] == [
        "ts",
        "events",
        "data_parallel_rank",
    ]
    for cls in (KVCacheEvent, BlockStored, BlockRemoved, AllBlocksCleared):
        config = cls.__struct_config__
        assert config.array_like and config.omit_defaults and not config.gc
        assert config.tag == cls.__name__ or cls is KVCacheEvent
    batch_config = KVEventBatch.__struct_config__
    assert batch_config.array_like and batch_config.omit_defaults and not batch_config.gc
    assert batch_config.tag is None
    assert MEDIUM_GPU == "GPU"


def test_event_hashes():
    a = BlockStored([1], None, [1, 2], 2, None, "GPU", "x")
    b = BlockStored([1], None, [1, 2], 2, None, "GPU", "y")
    # lora_name is not part of the hash (as vLLM: events aggregate across workers).
    assert hash(a) == hash(b)
    assert hash(BlockRemoved([1], "GPU")) == hash(BlockRemoved([1], "GPU"))
    assert len({BlockRemoved([1], "GPU"), BlockRemoved([1], "GPU")}) == 1


@pytest.mark.parametrize("env", [None, "1", "0"])
def test_events_identical_across_cores(all_cores, monkeypatch, env):
    if env is None:
        monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
    else:
        monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", env)
    encoded = {
        core.__name__: msgspec.msgpack.encode(
            KVEventBatch(ts=2.0, events=run_known_sequence(block_pool_class(core)))
        )
        for core in all_cores
    }
    assert len(set(encoded.values())) == 1, encoded


def vllm_event_structs():
    """vLLM 0.15.1's event structs (``vllm/distributed/kv_events.py``), declared
    here independently of kvpool: the oracle for byte-identity. (This module
    has no ``from __future__ import annotations``: the annotations below must
    resolve to these local classes, not to kvpool's.)"""

    class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
        ts: float
        events: list
        data_parallel_rank: int | None = None

    class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
        pass

    class BlockStored(KVCacheEvent):
        block_hashes: list[bytes | int]
        parent_block_hash: bytes | int | None
        token_ids: list[int]
        block_size: int
        lora_id: int | None
        medium: str | None
        lora_name: str | None

    class BlockRemoved(KVCacheEvent):
        block_hashes: list[bytes | int]
        medium: str | None

    class AllBlocksCleared(KVCacheEvent):
        pass

    class KVEventBatch(EventBatch):
        events: list[BlockStored | BlockRemoved | AllBlocksCleared]

    return {
        cls.__name__: cls for cls in (BlockStored, BlockRemoved, AllBlocksCleared, KVEventBatch)
    }


@pytest.mark.parametrize("env", [None, "0"])
@pytest.mark.parametrize("rank", [None, 0, 3])
def test_same_bytes_as_vllm_structs(BlockPool, monkeypatch, env, rank):
    if env is None:
        monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
    else:
        monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", env)
    vllm = vllm_event_structs()
    events = run_known_sequence(BlockPool) + run_raw_sequence(BlockPool)
    theirs = vllm["KVEventBatch"](
        ts=12.25,
        events=[vllm[type(e).__name__](*msgspec.structs.astuple(e)) for e in events],
        data_parallel_rank=rank,
    )
    ours = KVEventBatch(ts=12.25, events=events, data_parallel_rank=rank)
    assert msgspec.msgpack.encode(ours) == msgspec.msgpack.encode(theirs)
    # And a consumer built on vLLM's structs decodes our bytes to the same values.
    decoded = msgspec.msgpack.Decoder(vllm["KVEventBatch"]).decode(msgspec.msgpack.encode(ours))
    assert decoded == theirs


class _Recorded:
    """An event class that records each construction (keywords only, as
    the facades build ``BlockRemoved``)."""

    built: list = []

    def __init__(self, **fields):
        self.fields = fields
        _Recorded.built.append(fields)

    def __eq__(self, other):
        return type(other) is _Recorded and other.fields == self.fields

    def __repr__(self):
        return f"_Recorded({self.fields})"


class _Key(bytes):
    """A bytes subclass: keys are checked with isinstance(key, bytes)."""


# Keys of every length class: a 32-byte hash, an 8-byte one, shorter than
# the eight bytes converted, exactly the 4-byte suffix, shorter than it, empty.
_REMOVED_KEYS = [
    H0 + (0).to_bytes(4, "big"),
    H2 + (7).to_bytes(4, "big"),
    (0xFFFFFFFFFFFFFFFF).to_bytes(8, "big") + (0xFFFFFFFF).to_bytes(4, "big"),
    b"\x01\x02" + (0x01020304).to_bytes(4, "big"),
    b"\x00\x00\x01\x00",
    b"\x05\x06",
    b"",
    _Key(H1 + (2).to_bytes(4, "big")),
]


@pytest.mark.parametrize("with_group", [False, True])
@pytest.mark.parametrize("use_int", [False, True])
def test_removed_events_both_cores(all_cores, with_group, use_int):
    """``PoolCore._removed_events``, which every facade's ``BlockRemoved``
    events come from, against the definition written out here: per key, in
    order, its hash (the key less its last four bytes; as an int the low 64
    bits of its big-endian value) and its group (those four bytes,
    unsigned), on both cores."""
    expected = []
    for key in _REMOVED_KEYS:
        h = bytes(key[: max(len(key) - 4, 0)])
        fields = {
            "block_hashes": [int.from_bytes(h, "big") & (2**64 - 1) if use_int else h],
            "medium": "M",
        }
        if with_group:
            fields["group_idx"] = int.from_bytes(key[max(len(key) - 4, 0):], "big")
        expected.append(fields)
    for core in all_cores:
        _Recorded.built = []
        got = core.PoolCore(4)._removed_events(
            _Recorded, list(_REMOVED_KEYS), "M", with_group, use_int)
        assert [e.fields for e in got] == expected, core.__name__
        for event in got:  # exact types: bytes (not the subclass), int
            (h,) = event.fields["block_hashes"]
            assert type(h) is (int if use_int else bytes), (core.__name__, type(h))
            if with_group:
                assert type(event.fields["group_idx"]) is int


def test_removed_events_bad_key_builds_nothing(all_cores):
    """A key that is not bytes: a TypeError before any event is built."""
    for core in all_cores:
        _Recorded.built = []
        pool = core.PoolCore(4)
        with pytest.raises(TypeError, match="evicted key must be bytes"):
            pool._removed_events(_Recorded, [H0 + b"\0" * 4, "not bytes"], "M", True, True)
        assert _Recorded.built == [], core.__name__
        with pytest.raises(TypeError):
            pool._removed_events(_Recorded, (H0 + b"\0" * 4,), "M", True, True)
        assert _Recorded.built == [], core.__name__
