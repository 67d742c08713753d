"""kvpool's request block hasher against vLLM 0.33's own: the shared tests of
``tests/_hasher_vllm.py``, plus ``num_hash_lookahead_tokens``. Skipped where
vLLM 0.33 is not importable."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_utils")
import vllm  # noqa: E402

if not vllm.__version__.startswith("0.33."):
    pytest.skip(f"vLLM {vllm.__version__} is not of the 0.33 line", allow_module_level=True)

from _hasher_vllm import *  # noqa: E402,F401,F403  (the shared tests)
from _hasher_vllm import ALGORITHMS, KINDS, check_same_hashes  # noqa: E402


@pytest.mark.parametrize("lookahead", [1, 3])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("seed", range(4))
def test_same_hashes_with_lookahead(seed, algorithm, kind, lookahead, none_hash_mode):
    check_same_hashes(seed, algorithm, kind, lookahead)
