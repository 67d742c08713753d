"""kvpool's request block hasher against the release's own, for every release
of a line whose hasher kvpool installs (``kvpool.vllm_hasher.
SUPPORTED_VLLM_LINES``): the shared tests of ``tests/_hasher_vllm.py`` (every
hash algorithm, plain / LoRA / cache-salt / multimodal / prompt-embeds
requests, both ``NONE_HASH`` conventions), and with lookahead hashing where
the release has it. Skipped for the other releases, whose engines keep
vLLM's hasher."""

from __future__ import annotations

import re

import pytest
import vllm

from kvpool.vllm_hasher import SUPPORTED_VLLM_LINES

_series = re.match(r"(\d+)\.(\d+)", vllm.__version__)
if _series is None or (int(_series[1]), int(_series[2])) not in SUPPORTED_VLLM_LINES:
    pytest.skip(
        f"vLLM {vllm.__version__}: kvpool's hasher is not installed for this line "
        f"(kvpool.vllm_hasher.SUPPORTED_VLLM_LINES)",
        allow_module_level=True,
    )

from _hasher_vllm import *  # noqa: E402,F401,F403  (the shared tests, lookahead included)
