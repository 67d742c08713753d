"""The request block hasher without vLLM: the C serialisers give exactly
``pickle.dumps(x, protocol=5)`` / ``cbor2.dumps(x, canonical=True)`` for the
values vLLM hashes (or say they cannot, and the Python serialiser is used),
the digests are SHA-256 / XXH3-128, and ``kvpool.hashing``'s functions give
vLLM's hashes on both implementations (compiled, pure-Python)."""

from __future__ import annotations

import hashlib
import importlib
import pickle
import subprocess
import sys

import cbor2
import pytest
import xxhash
from hypothesis import assume, given
from hypothesis import strategies as st

from conftest import C_EXT_MARK
from kvpool import hashing

ALGORITHMS = hashing.HASH_ALGORITHMS
INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


@pytest.fixture(scope="module")
def chasher():
    """The compiled hasher (required unless --no-c-extensions)."""
    try:
        return importlib.import_module("kvpool._hasher")
    except ImportError as exc:
        pytest.fail(f"cannot import kvpool._hasher ({exc}); build it in place", pytrace=False)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("kvpool._hasher", id="c-extension", marks=C_EXT_MARK),
        pytest.param("kvpool._hasher_py", id="pure-python"),
    ],
)
def implementation(request):
    """``kvpool.hashing`` running on one implementation."""
    module = importlib.import_module(request.param)
    saved = hashing._hasher()
    hashing._hasher_module = module
    yield module
    hashing._hasher_module = saved


# ----------------------------------------------------------- the references


def reference_serialize(obj, algorithm):
    if algorithm.endswith("_cbor"):
        return cbor2.dumps(obj, canonical=True)
    return pickle.dumps(obj, protocol=5)


def reference_hash(obj, algorithm):
    data = reference_serialize(obj, algorithm)
    if algorithm.startswith("xxhash"):
        return xxhash.xxh3_128_digest(data)
    return hashlib.sha256(data).digest()


def reference_chain(tokens, block_size, algorithm, parent, extra_keys=None):
    out = []
    for i in range(len(tokens) // block_size):
        extra = None if extra_keys is None else extra_keys[i]
        parent = reference_hash(
            (parent, tuple(tokens[i * block_size : (i + 1) * block_size]), extra), algorithm
        )
        out.append(parent)
    return out


# ---------------------------------------------------------------- strategies

# Text without lone surrogates (what the C path reproduces) and with them.
TEXT = st.text(max_size=40) | st.text(min_size=250, max_size=300)
SURROGATE_TEXT = st.builds(lambda a, b: a + "\ud800" + b, st.text(max_size=5), st.text(max_size=5))
LEAVES = (
    st.none()
    | st.booleans()
    | INT64
    | st.integers()
    | st.binary(max_size=40)
    | st.binary(min_size=250, max_size=300)
    | TEXT
)


def _tuples(children):
    return st.lists(children, max_size=6).map(tuple)


# vLLM's extra keys: tuples of str / int / bytes / nested tuples / None.
VALUES = st.recursive(LEAVES, _tuples, max_leaves=25)


@st.composite
def shared_values(draw):
    """Tuples that hold the *same* objects more than once (pickle's memo
    writes them as references): a pool of objects, then tuples of picks."""
    pool = draw(st.lists(st.binary(max_size=8) | st.text(max_size=8) | _tuples(INT64), min_size=1, max_size=5))
    # Equal values as distinct objects, too.
    pool += [bytes(bytearray(x)) if isinstance(x, bytes) else x for x in pool]
    picks = st.sampled_from(pool)
    inner = st.lists(picks, max_size=4).map(tuple)
    return draw(st.lists(picks | inner, min_size=1, max_size=8).map(tuple))


def block_tuples(extra=VALUES):
    return st.tuples(
        st.binary(min_size=16, max_size=32),
        st.lists(INT64 | st.integers(0, 300_000), max_size=40).map(tuple),
        st.none() | _tuples(extra),
    )


def c_reproduces(obj, depth=0) -> bool:
    """Whether ``obj`` is of a shape the C serialisers reproduce."""
    if obj is None or obj is True or obj is False:
        return True
    if type(obj) is int:
        return -(2**63) <= obj < 2**63
    if type(obj) is bytes:
        return True
    if type(obj) is str:
        try:
            obj.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if type(obj) is tuple:
        return depth < 63 and all(c_reproduces(x, depth + 1) for x in obj)
    return False


# ---------------------------------------------------- C serialisers, bytes


@C_EXT_MARK
@pytest.mark.parametrize("serialiser", ["sha256", "sha256_cbor"])
@given(obj=VALUES | block_tuples() | shared_values())
def test_c_serialiser_is_pickle_and_cbor(chasher, serialiser, obj):
    data = chasher.serialize(obj, serialiser)
    if c_reproduces(obj):
        assert data == reference_serialize(obj, serialiser)
    else:
        assert data is None


@C_EXT_MARK
@pytest.mark.parametrize("serialiser", ["sha256", "sha256_cbor"])
@given(obj=VALUES | shared_values(), bad=st.sampled_from([1.5, 2**64, -(2**63) - 1, "\udc80", [1], {}, 2**200]))
def test_c_serialiser_declines_other_shapes(chasher, serialiser, obj, bad):
    value = (obj, bad)
    assert chasher.serialize(value, serialiser) is None
    # ... and the hash is still the reference's (the fallback serialises it).
    for algorithm in ALGORITHMS:
        if algorithm.endswith("_cbor") == serialiser.endswith("_cbor"):
            try:
                expected = reference_hash(value, algorithm)
            except Exception as exc:  # cbor2 refuses lone surrogates
                with pytest.raises(type(exc)):
                    hashing.hash_object(value, algorithm)
            else:
                assert hashing.hash_object(value, algorithm) == expected


@C_EXT_MARK
@pytest.mark.parametrize("serialiser", ["sha256", "sha256_cbor"])
@pytest.mark.parametrize("size", [65_535, 65_536, 65_537, 200_000])
@pytest.mark.parametrize("where", ["bytes", "str", "two", "after_small"])
def test_c_serialiser_frames_large_payloads(chasher, serialiser, size, where):
    """Protocol 5 frames: a payload of 64 KiB or more is written between
    frames, and a frame is closed once it reaches 64 KiB."""
    big = b"\x01" * size
    text = "\u00e9" * (size // 2)
    small = tuple(range(5000))  # ~15 KiB of opcodes per copy
    value = {
        "bytes": (b"p" * 32, (1, 2, 3), (big,)),
        "str": (b"p" * 32, (1,), ("cache_salt", text)),
        "two": (big, small, (big, text, b"x")),
        "after_small": (small, small, small, small, small, big, small),
    }[where]
    assert chasher.serialize(value, serialiser) == reference_serialize(value, serialiser)


@C_EXT_MARK
@pytest.mark.parametrize("serialiser", ["sha256", "sha256_cbor"])
def test_c_serialiser_memo_limits(chasher, serialiser):
    """Deep nesting and more than 256 memoised objects: pickle's own bytes
    (LONG_BINGET is left to pickle) or exactly the reference."""
    many = tuple(f"s{i}" for i in range(300)) + ("s0",)
    many = many + (many[5],)
    deep = ()
    for _ in range(70):
        deep = (deep, 1)
    for value in (many, deep, tuple(range(255)) * 2):
        data = chasher.serialize(value, serialiser)
        assert data is None or data == reference_serialize(value, serialiser)
    for value in (many, deep):
        for algorithm in ALGORITHMS:
            if algorithm.endswith("_cbor") == serialiser.endswith("_cbor"):
                assert hashing.hash_object(value, algorithm) == reference_hash(value, algorithm)


# ------------------------------------------------------------------ digests


@C_EXT_MARK
@pytest.mark.parametrize("backend", ["portable", "sha-ni"])
def test_sha256_backends(chasher, backend):
    try:
        chasher.select_sha256_backend(backend)
        for n in [*range(0, 260), 1000, 4095, 4096, 65_536, 100_003]:
            data = bytes((i * 131 + n) & 0xFF for i in range(n))
            assert chasher.digest(data, "sha256") == hashlib.sha256(data).digest(), n
    finally:
        chasher.select_sha256_backend("best")


@C_EXT_MARK
@given(data=st.binary(max_size=600))
def test_digests_are_sha256_and_xxh3_128(chasher, data):
    assert chasher.digest(data, "sha256") == hashlib.sha256(data).digest()
    assert chasher.digest(data, "sha256_cbor") == hashlib.sha256(data).digest()
    assert chasher.digest(data, "xxhash") == xxhash.xxh3_128_digest(data)
    assert chasher.digest(memoryview(data), "xxhash_cbor") == xxhash.xxh3_128_digest(data)


# --------------------------------------------- kvpool.hashing, both cores


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@given(
    tokens=st.lists(st.integers(0, 300_000) | INT64, max_size=120),
    block_size=st.sampled_from([1, 2, 3, 4, 7, 16]),
    parent=st.none() | st.binary(min_size=1, max_size=32),
    data=st.data(),
)
def test_hash_request_tokens_equals_vllms_chain(implementation, algorithm, tokens, block_size, parent, data):
    num_blocks = len(tokens) // block_size
    extra_keys = data.draw(st.none() | st.lists(st.none() | _tuples(VALUES), min_size=num_blocks, max_size=num_blocks))
    none = hashing.none_hash(algorithm)
    got = hashing.hash_request_tokens(
        tokens, block_size, algorithm=algorithm, parent_block_hash=parent, extra_keys=extra_keys
    )
    assert got == reference_chain(tokens, block_size, algorithm, parent or none, extra_keys)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_none_hash_and_single_blocks(implementation, algorithm):
    seed_hash = hashing.none_hash(algorithm)
    assert seed_hash == reference_hash("vllm-none-hash", algorithm)
    assert hashing.none_hash(algorithm, "12345") == reference_hash("12345", algorithm)
    tokens = list(range(48))
    chain = hashing.hash_request_tokens(tokens, 16, algorithm=algorithm)
    assert hashing.hash_block_tokens(None, tokens[:16], algorithm=algorithm) == chain[0]
    assert hashing.hash_block_tokens(b"", tokens[:16], algorithm=algorithm) == chain[0]
    assert hashing.hash_block_tokens(chain[0], tokens[16:32], algorithm=algorithm) == chain[1]
    # The chain continues from any block: the tail hashed from its parent.
    assert hashing.hash_request_tokens(tokens[16:], 16, algorithm=algorithm, parent_block_hash=chain[0]) == chain[1:]
    # A custom NONE_HASH (vLLM's random one) is used for the first block only.
    custom = b"\x07" * 32
    assert hashing.hash_request_tokens(tokens, 16, algorithm=algorithm, none_hash=custom) == (
        reference_chain(tokens, 16, algorithm, custom)
    )
    assert len(chain[0]) == (16 if algorithm.startswith("xxhash") else 32)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_vllm_shaped_extra_keys(implementation, algorithm):
    """Both extra-key conventions: 0.15's plain keys, 0.33's tagged ones
    (with the shared "mm" constant), and 0.33's lookahead keys."""
    tokens = list(range(1000, 1064))
    mm = "mm"
    lora = "adapter"
    conventions = [
        [("adapter", "img0", "salt"), ("adapter", "img0", "img1"), ("adapter", b"\x00" * 32), ("adapter",)],
        [
            (("lora", lora, lora), (mm, "img0", 3), ("cache_salt", "s")),
            (("lora", lora, "/p"), (mm, "img0", -13), (mm, "img1", 9)),
            (("prompt_embeds", hashlib.sha256(b"e").digest()),),
            None,
        ],
        [(None, 5), ((("lora", lora, lora),), 7, 8, 9), (None, 2**40), (((mm, "i", 0),), -1)],
    ]
    for extra_keys in conventions:
        got = hashing.hash_request_tokens(tokens, 16, algorithm=algorithm, extra_keys=extra_keys)
        assert got == reference_chain(tokens, 16, algorithm, hashing.none_hash(algorithm), extra_keys)


@C_EXT_MARK
def test_fallback_only_for_blocks_it_cannot_write(chasher):
    calls = []

    def fallback(obj):
        calls.append(obj)
        return reference_hash(obj, "sha256")

    tokens = [1, 2, 3, 4, 2**70, 6, 7, 8, 9, 10, 11, 12]
    extra = [None, None, ("x",)]
    got = chasher.hash_blocks("sha256", b"p" * 32, tokens, 4, 3, extra, fallback)
    assert got == reference_chain(tokens, 4, "sha256", b"p" * 32, extra)
    assert len(calls) == 1 and calls[0][1] == (2**70, 6, 7, 8)


class TokenBuffer(__import__("array").array):
    """vLLM 0.34's ``TokenBuffer`` as the hasher sees it: an ``array('i')``
    whose slices are lists."""

    def __new__(cls, tokens=()):
        return super().__new__(cls, "i", tokens)

    def __getitem__(self, index):
        item = super().__getitem__(index)
        return item.tolist() if isinstance(index, slice) else item


class ConstantList:
    """vLLM's read-only wrapper: the hasher reads its ``_x``."""

    def __init__(self, x):
        self._x = x


def _request(tokens, hashed=()):
    from types import SimpleNamespace

    return SimpleNamespace(block_hashes=list(hashed), all_token_ids=ConstantList(tokens),
                           num_tokens=len(tokens), lora_request=None, cache_salt=None,
                           mm_features=None, prompt_embeds=None)


@C_EXT_MARK
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("block_size", [1, 3, 16, 20_000])
def test_token_buffer_is_hashed_from_its_ints(chasher, algorithm, block_size):
    """0.34's int32 token buffer: serialised straight from its C ints, the
    bytes pickle / cbor2 give for the tuple of its values (every int32
    width, negatives, a block past pickle's 64 KiB frame), in the same chain
    as the list path; a hashed prefix is continued; vLLM's hash function is
    never called."""
    import random

    rng = random.Random(block_size)
    widths = [lambda: rng.randrange(256), lambda: rng.randrange(65_536),
              lambda: rng.randrange(2**31), lambda: -rng.randrange(1, 2**31 + 1)]
    values = [rng.choice(widths)() for _ in range(3 * block_size + block_size // 2 + 1)]

    def never(obj):
        raise AssertionError(f"vLLM's hash function was called for {obj!r:.80}")

    holder = type("KvCacheUtils", (), {"NONE_HASH": b"n" * 32})
    hasher = chasher.RequestBlockHasher(algorithm, block_size, 0, holder, ConstantList,
                                        None, never, never, TokenBuffer)
    want = reference_chain(values, block_size, algorithm, b"n" * 32)
    got = hasher(_request(TokenBuffer(values)))
    assert got == want
    assert hasher(_request(TokenBuffer(values), want[:1])) == want[1:]
    # The same hasher without the buffer type copies the tokens to a list first.
    plain = chasher.RequestBlockHasher(algorithm, block_size, 0, holder, ConstantList,
                                       None, never, never)
    assert plain(_request(TokenBuffer(values))) == want


def test_bad_arguments(implementation):
    with pytest.raises(ValueError):
        hashing.hash_request_tokens([1, 2], 1, algorithm="md5")
    with pytest.raises(ValueError):
        hashing.hash_request_tokens([1, 2], 0)
    with pytest.raises(ValueError):
        hashing.hash_request_tokens([1, 2, 3, 4], 2, extra_keys=[None])
    with pytest.raises(ValueError):
        implementation.hash_blocks("sha256", b"p", [1, 2, 3], 2, 2, None, None)
    with pytest.raises(ValueError):
        implementation.hash_blocks("sha256", b"p", [1, 2, 3], 0, 1, None, None)
    assert hashing.hash_request_tokens([], 16) == []
    assert hashing.hash_request_tokens(range(20), 16) == hashing.hash_request_tokens(list(range(16)), 16)


def test_import_kvpool_imports_no_hashing_dependency():
    code = (
        "import sys, kvpool, kvpool.hashing, kvpool.vllm, kvpool.vllm.hasher;"
        "print(sorted(m for m in ('vllm', 'torch', 'cbor2', 'xxhash') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@C_EXT_MARK
def test_sha256_backend_is_reported(chasher):
    assert chasher.SHA256_BACKEND in ("sha-ni", "portable")


@C_EXT_MARK
def test_self_check_passes_and_a_failed_one_means_python_serialisers(chasher):
    """The serialisers pass their self-check on this interpreter; one that
    failed it is never used: every block is hashed by the fallback."""
    tokens = list(range(64))
    for algorithm in ALGORITHMS:
        chasher.hash_blocks(algorithm, b"p", tokens, 16, 4, None, None)
    assert chasher._serializer_states() == (1, 1)
    calls = []

    def fallback(obj):
        calls.append(obj)
        return reference_hash(obj, "sha256")

    try:
        chasher._set_serializer_states(-1, -1)
        got = chasher.hash_blocks("sha256", b"p" * 32, tokens, 16, 4, None, fallback)
        assert len(calls) == 4
        assert got == reference_chain(tokens, 16, "sha256", b"p" * 32)
        assert chasher.hash_object("x", "sha256_cbor", lambda obj: b"fallback") == b"fallback"
    finally:
        chasher._set_serializer_states(0, 0)  # re-checked on next use
    got = chasher.hash_blocks("sha256", b"p" * 32, tokens, 16, 4, None, None)
    assert got == reference_chain(tokens, 16, "sha256", b"p" * 32)
    assert chasher._serializer_states()[0] == 1
