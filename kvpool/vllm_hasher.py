"""Deprecated: ``kvpool.vllm.hasher``, under the module name it had before
``kvpool.vllm`` became a package (docs/hashing.md told users to call
``kvpool.vllm_hasher.install_hasher()``). This name is the same module
object, so setting an attribute here sets it there."""

import sys
import warnings

from .vllm import hasher as _hasher

warnings.warn(
    "kvpool.vllm_hasher is kvpool.vllm.hasher now; import that",
    DeprecationWarning,
    stacklevel=2,
)
sys.modules[__name__] = _hasher
