"""kvpool's request block hasher against vLLM 0.33's own: the shared tests of
``tests/_hasher_vllm.py``, ``num_hash_lookahead_tokens`` included. Skipped where
vLLM 0.33 is not importable."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm.v1.core.kv_cache_utils")
import vllm  # noqa: E402

if not vllm.__version__.startswith("0.33."):
    pytest.skip(f"vLLM {vllm.__version__} is not of the 0.33 line", allow_module_level=True)

from _hasher_vllm import *  # noqa: E402,F401,F403  (the shared tests, lookahead included)
