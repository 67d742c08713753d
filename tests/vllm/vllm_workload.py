"""Moved to kvpool/vllm/proof/_workload.py (``python -m kvpool.vllm --prove``
runs it): this name is that module, for the tests and benchmarks that import
it as ``vllm_workload``."""

import sys

from kvpool.vllm.proof import _workload

sys.modules[__name__] = _workload
