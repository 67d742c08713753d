"""Moved to kvpool/vllm/proof/_workload33.py (``python -m kvpool.vllm
--prove`` runs it): this name is that module, for the tests and benchmarks
that import it as ``vllm_workload33``."""

import os
import sys

from kvpool.vllm.proof import _workload33

# The module used to put tests/vllm on sys.path (for its own ``import
# vllm_workload``); its importers still import that name after it.
_V15 = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "vllm")
if _V15 not in sys.path:
    sys.path.insert(0, _V15)
sys.modules[__name__] = _workload33
