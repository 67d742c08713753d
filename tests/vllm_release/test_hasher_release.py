"""kvpool's request block hasher against the release's own, on every listed
release (every line installs it: ``VLLMLine.hasher``): the shared tests of
``tests/_hasher_vllm.py`` (every hash algorithm, plain / LoRA / cache-salt /
multimodal / prompt-embeds requests, both ``NONE_HASH`` conventions, and
lookahead hashing where the release has it), and planted faults, each of
which those tests must catch on this release."""

from __future__ import annotations

import pytest
import vllm

from kvpool.vllm import UnsupportedVLLMVersionError, vllm_line

try:
    _LINE = vllm_line(vllm.__version__)
except UnsupportedVLLMVersionError:  # (the intake runs a release as a listed one's)
    _LINE = None
if _LINE is not None and not _LINE.hasher:
    pytest.skip(f"vLLM {vllm.__version__}: the {_LINE.name} line keeps vLLM's hasher",
                allow_module_level=True)

from _hasher_vllm import *
from _hasher_vllm import PLANTED_FAULTS, planted_faults_are_caught


@pytest.mark.parametrize("fault", sorted(PLANTED_FAULTS))
def test_planted_fault_is_caught(fault):
    planted_faults_are_caught(fault)
