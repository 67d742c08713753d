"""Moved to kvpool/vllm/proof/_trace.py (``python -m kvpool.vllm --prove``
uses it): this name is that module, for the tests that import it as
``_manager_trace``."""

import sys

from kvpool.vllm.proof import _trace

sys.modules[__name__] = _trace
