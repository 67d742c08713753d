"""kvpool's request block hasher against vLLM 0.15.1 / 0.16.0's own: the
shared tests of ``tests/_hasher_vllm.py`` (the plain extra keys of that line:
bare LoRA names, mm identifiers, cache salts, prompt-embeds bytes)."""

from __future__ import annotations

import pytest
import vllm

if not vllm.__version__.startswith(("0.15.", "0.16.")):
    pytest.skip(f"vLLM {vllm.__version__} is not of the 0.15 line", allow_module_level=True)

from _hasher_vllm import *  # noqa: E402,F401,F403  (the shared tests)
