"""Type stubs of kvpool._caching: vLLM's KVCacheManager.cache_blocks in C (see kvpool/_caching.pyx)."""

from typing import Any

def cache_blocks(self: Any, request: Any, num_computed_tokens: int) -> None: ...
