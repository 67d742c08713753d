"""kvpool's request block hasher against vLLM's own, in a vLLM environment:
the checks of ``python -m kvpool.vllm --prove`` (``kvpool/vllm/proof/hasher.py``,
which says what they compare) as pytest tests, and what only a test can
check (the installed names, the environment variable, that blocks are
hashed in C).

Shared by ``tests/vllm/test_hasher_vllm.py`` (vLLM 0.15.1 / 0.16.0),
``tests/vllm33/test_hasher_vllm33.py`` (0.33.0) and
``tests/vllm_release/test_hasher_release.py`` (each release of a hasher
line), which import these tests after checking the vLLM line. Imports vLLM:
import it only where vLLM is.
"""

from __future__ import annotations

import random

import pytest
from vllm.utils import hashing as vllm_hashing
from vllm.v1.core import kv_cache_utils

from kvpool.vllm import hasher as vllm_hasher
from kvpool.vllm.proof import hasher as proof
from kvpool.vllm.proof.hasher import (
    HAS_LOOKAHEAD,
    HAVE_XXHASH,
    KINDS,
    PLANTED_FAULTS,
    Spec,
    _hashers,
    check_same_hashes,
    planted_faults_are_caught,
    random_spec,
)

ALGORITHMS = [
    pytest.param(name, marks=pytest.mark.skipif(
        name.startswith("xxhash") and not HAVE_XXHASH,
        reason="vLLM's xxhash algorithms need the xxhash package",
    ))
    for name in proof.ALGORITHM_NAMES
]


@pytest.fixture(params=proof.NONE_HASH_MODES)
def none_hash_mode(request, monkeypatch):
    proof.none_hash_mode(monkeypatch, request.param)
    return request.param


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("seed", range(6))
def test_same_hashes_as_vllm(seed, algorithm, kind, none_hash_mode):
    check_same_hashes(seed, algorithm, kind)


def test_none_hash_read_at_call_time(none_hash_mode):
    theirs, ours = _hashers("sha256", 4, 0)
    kv_cache_utils.NONE_HASH = b"\x42" * 32
    spec = Spec(list(range(9)), None, [], None, None)
    assert spec.build("a", theirs).block_hashes == spec.build("b", ours).block_hashes


def test_other_hash_fn_gets_vllms_hasher():
    def custom(obj):
        return vllm_hashing.sha256(obj)[:8]

    kv_cache_utils.init_none_hash(vllm_hashing.sha256)
    hasher = vllm_hasher.get_request_block_hasher(4, custom)
    assert not getattr(hasher, "kvpool", False)
    spec = Spec(list(range(9)), None, [], None, None)
    assert all(len(h) == 8 for h in spec.build("a", hasher).block_hashes)


def test_install_rebinds_the_engine_core_name(monkeypatch):
    import vllm.v1.engine.core as engine_core

    monkeypatch.delenv(vllm_hasher.ENV_VAR, raising=False)
    original = engine_core.get_request_block_hasher
    assert original is kv_cache_utils.get_request_block_hasher
    assert vllm_hasher.install_hasher()
    try:
        assert vllm_hasher.hasher_installed()
        assert not vllm_hasher.install_hasher()  # idempotent
        assert engine_core.get_request_block_hasher is vllm_hasher.get_request_block_hasher
        assert kv_cache_utils.get_request_block_hasher is original  # vLLM's own stays
    finally:
        assert vllm_hasher.uninstall_hasher()
    assert engine_core.get_request_block_hasher is original
    assert not vllm_hasher.hasher_installed()
    assert not vllm_hasher.uninstall_hasher()


@pytest.mark.parametrize("value", ["0", "false", "off"])
def test_env_var_keeps_vllms_hasher(monkeypatch, value):
    import vllm.v1.engine.core as engine_core

    monkeypatch.setenv(vllm_hasher.ENV_VAR, value)
    original = engine_core.get_request_block_hasher
    assert not vllm_hasher.install_hasher()
    assert engine_core.get_request_block_hasher is original
    assert not vllm_hasher.hasher_installed()


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "odd_tokens"])
def test_blocks_are_hashed_in_c(monkeypatch, kind):
    """vLLM's hash function is never called by kvpool's hasher for requests
    of vLLM's shapes: every block went through the C serialiser."""
    calls = []
    real = vllm_hashing.sha256

    def spy(obj):
        calls.append(obj)
        return real(obj)

    monkeypatch.setattr(vllm_hashing, "sha256", spy)
    kv_cache_utils.init_none_hash(real)
    hasher = vllm_hasher.get_request_block_hasher(16, spy)
    assert getattr(hasher, "kvpool", False)
    for seed in range(5):
        request = random_spec(random.Random(seed), kind, 16).build("r", hasher)
        request.append_output_token_ids(list(range(40)))
    assert calls == []


def test_kv_cache_utils_rebound_to_kvpools(monkeypatch):
    """A harness may rebind vLLM's own name to kvpool's (to run a workload
    with it): kvpool's factory still finds vLLM's, never itself."""
    kv_cache_utils.init_none_hash(vllm_hashing.sha256)
    theirs = kv_cache_utils.get_request_block_hasher(4, vllm_hashing.sha256)
    vllm_hasher._vllm_get_request_block_hasher(kv_cache_utils)
    monkeypatch.setattr(kv_cache_utils, "get_request_block_hasher", vllm_hasher.get_request_block_hasher)
    ours = kv_cache_utils.get_request_block_hasher(4, vllm_hashing.sha256)
    assert getattr(ours, "kvpool", False)
    spec = Spec(list(range(30)), None, [("img", 2, 5)], None, "salt")
    assert spec.build("a", theirs).block_hashes == spec.build("b", ours).block_hashes


@pytest.mark.skipif(not HAS_LOOKAHEAD, reason="this vLLM has no lookahead hashing (0.33 on)")
@pytest.mark.parametrize("lookahead", [1, 3])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("seed", range(4))
def test_same_hashes_with_lookahead(seed, algorithm, kind, lookahead, none_hash_mode):
    check_same_hashes(seed, algorithm, kind, lookahead)


def test_prove_runs_these_checks():
    """What ``--prove`` runs: every seed, algorithm, kind and convention of
    the tests above, and every planted fault."""
    import vllm

    from kvpool.vllm import vllm_line

    names = [c.name for c in proof.cases(vllm_line(vllm.__version__))]
    assert "seed 5, sha256, mm_lora_salt, NONE_HASH seeded" in names
    assert {f"planted fault {f} caught" for f in PLANTED_FAULTS} <= set(names)
    assert any("lookahead 3" in n for n in names) == HAS_LOOKAHEAD
