"""Hash-key packing helpers (kvpool.hashing) and the public names."""

from __future__ import annotations

import sys
import types

import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvpool
from kvpool import (
    BlockHashListWithBlockSize,
    get_block_hash,
    get_group_id,
    hashing,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
)

ENV = "VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES"

PUBLIC_NAMES = [
    "KVCacheBlock",
    "FreeKVCacheBlockQueue",
    "BlockHashToBlockMap",
    "BlockPool",
    "KVCacheMetricsCollector",
    "BlockMetricsState",
    "KVCacheEvictionEvent",
    "KVCacheEvent",
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "KVEventBatch",
    "MEDIUM_GPU",
    "BlockHash",
    "BlockHashWithGroupId",
    "ExternalBlockHash",
    "make_block_hash_with_group_id",
    "get_block_hash",
    "get_group_id",
    "maybe_convert_block_hash",
    "BlockHashListWithBlockSize",
]


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_public_name(name):
    assert hasattr(kvpool, name)
    assert name in kvpool.__all__


def test_make_block_hash_with_group_id():
    assert make_block_hash_with_group_id(b"abc", 0) == b"abc\x00\x00\x00\x00"
    assert make_block_hash_with_group_id(b"abc", 1) == b"abc\x00\x00\x00\x01"
    assert make_block_hash_with_group_id(b"abc", 0x01020304) == b"abc\x01\x02\x03\x04"
    assert make_block_hash_with_group_id(b"", 2**32 - 1) == b"\xff\xff\xff\xff"
    assert type(make_block_hash_with_group_id(b"abc", 3)) is bytes


@pytest.mark.parametrize("group_id", [-1, 2**32, 2**40])
def test_make_block_hash_with_bad_group_id(group_id):
    with pytest.raises(OverflowError):
        make_block_hash_with_group_id(b"abc", group_id)


@given(h=st.binary(max_size=40), group=st.integers(0, 2**32 - 1))
def test_key_round_trip(h, group):
    k = make_block_hash_with_group_id(h, group)
    assert get_block_hash(k) == h
    assert get_group_id(k) == group
    assert len(k) == len(h) + 4


def test_maybe_convert_block_hash_default(monkeypatch):
    monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
    assert maybe_convert_block_hash(b"\x01\x02") == 0x0102
    assert maybe_convert_block_hash(b"") == 0
    # Low 64 bits of the big-endian value.
    h = bytes(range(1, 33))
    assert maybe_convert_block_hash(h) == int.from_bytes(bytes(range(25, 33)), "big")
    assert maybe_convert_block_hash(b"\xff" * 32) == 2**64 - 1
    assert maybe_convert_block_hash(b"\x80" + b"\x00" * 7) == 2**63


@pytest.mark.parametrize(("value", "expect_int"), [("1", True), ("0", False)])
def test_maybe_convert_block_hash_env(monkeypatch, value, expect_int):
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", value)
    got = maybe_convert_block_hash(b"\x00\x07")
    assert got == (7 if expect_int else b"\x00\x07")


def test_maybe_convert_block_hash_reads_env_each_call(monkeypatch):
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    assert maybe_convert_block_hash(b"\x05") == b"\x05"
    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")
    assert maybe_convert_block_hash(b"\x05") == 5


class _FakeEnvs:
    """Stands in for a vLLM envs module that is not a module object."""

    VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES = False


def _envs_module(getattr_hook=None, **attrs):
    module = types.ModuleType("vllm.envs")
    if getattr_hook is not None:
        module.__getattr__ = getattr_hook
    module.__dict__.update(attrs)
    return module


@pytest.mark.parametrize(
    "envs",
    [
        # vLLM's envs: the value from the module's __getattr__ ...
        pytest.param(_envs_module(lambda name: {ENV: False}[name]), id="getattr-false"),
        pytest.param(_envs_module(lambda name: {ENV: 1}[name]), id="getattr-true"),
        # ... unless the attribute itself is set (a test's monkeypatch).
        pytest.param(
            _envs_module(lambda name: {ENV: True}[name], **{ENV: False}), id="attribute-first"
        ),
        pytest.param(_envs_module(**{ENV: 0}), id="attribute-no-getattr"),
        pytest.param(_FakeEnvs(), id="not-a-module"),
    ],
)
def test_use_int_block_hashes_asks_vllm_envs_as_python_does(monkeypatch, envs):
    """Inside a vLLM process the setting is what ``vllm.envs.NAME`` gives
    (the environment variable is not read), however the module provides it."""
    monkeypatch.setitem(sys.modules, "vllm.envs", envs)
    monkeypatch.setenv(ENV, "1" if not getattr(envs, ENV) else "0")  # must be ignored
    assert hashing._use_int_block_hashes() is bool(getattr(envs, ENV))
    assert maybe_convert_block_hash(b"\x07") == (7 if getattr(envs, ENV) else b"\x07")


def test_use_int_block_hashes_unknown_to_vllm_envs(monkeypatch):
    """A vLLM whose envs module has no such setting: the AttributeError that
    ``vllm.envs.NAME`` raises."""
    monkeypatch.setitem(sys.modules, "vllm.envs", _envs_module())
    with pytest.raises(AttributeError):
        hashing._use_int_block_hashes()


def test_block_hash_list_with_block_size():
    hashes = [b"A", b"B", b"C", b"D", b"E"]
    view = BlockHashListWithBlockSize(hashes, 16, 32)
    assert len(view) == 2
    assert view[0] == b"AB"
    assert view[1] == b"CD"
    assert list(view) == [b"AB", b"CD"]
    assert view[0:2] == [b"AB", b"CD"]
    assert view[1:] == [b"CD"]
    assert view[:0] == []
    assert view[::-1] == [b"CD", b"AB"]


def test_block_hash_list_scale_one():
    hashes = [b"A", b"B"]
    view = BlockHashListWithBlockSize(hashes, 16, 16)
    assert list(view) == hashes
    assert len(view) == 2


def test_block_hash_list_is_a_live_view():
    hashes = [b"A", b"B"]
    view = BlockHashListWithBlockSize(hashes, 4, 8)
    assert len(view) == 1
    hashes += [b"C", b"D"]
    assert len(view) == 2
    assert view[1] == b"CD"


def test_block_hash_list_index_errors():
    view = BlockHashListWithBlockSize([b"A", b"B", b"C"], 16, 32)
    with pytest.raises(IndexError):
        view[2]
    with pytest.raises(TypeError):
        view["0"]


def test_block_hash_list_not_a_multiple():
    with pytest.raises(ValueError):
        BlockHashListWithBlockSize([b"A"], 16, 24)


@given(
    hashes=st.lists(st.binary(min_size=1, max_size=4), max_size=12),
    scale=st.integers(1, 4),
)
def test_block_hash_list_matches_concatenation(hashes, scale):
    view = BlockHashListWithBlockSize(hashes, 8, 8 * scale)
    expected = [b"".join(hashes[i : i + scale]) for i in range(0, len(hashes) - scale + 1, scale)]
    assert len(view) == len(expected)
    assert list(view) == expected
    assert view[:] == expected


@given(st.lists(st.binary(max_size=40), max_size=8))
def test_convert_block_hashes_is_maybe_convert_per_hash(hashes):
    from kvpool.hashing import convert_block_hashes

    assert convert_block_hashes(hashes) == [maybe_convert_block_hash(h) for h in hashes]


def test_convert_block_hashes_raw_bytes(monkeypatch):
    from kvpool.hashing import convert_block_hashes

    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    assert convert_block_hashes([b"ab", b"c"]) == [b"ab", b"c"]
