"""Put kvpool into vLLM: its ``BlockPool``, ``KVCacheManager`` and request
block hasher, for the release that is installed.

kvpool has a drop-in pool per vLLM API line (``VLLM_LINES``), each listing
the exact releases it was proven against: the 0.15 line
(``kvpool.v0_15.BlockPool``, also ``kvpool.BlockPool``) for vLLM 0.15.0,
0.15.1 and 0.16.0, whose pool files are byte-identical, the 0.34 line
(``kvpool.v0_34.BlockPool``) for 0.34.0, and so on; a line from 0.30 on
also has a compiled ``KVCacheManager``, and every line installs the compiled
request block hasher. ``install()`` picks the line of the installed vLLM
and refuses any release not listed. ``python -m kvpool.vllm`` says what it
would put into the vLLM installed here, and why not where it would not.

Three ways in::

    import kvpool.vllm
    kvpool.vllm.install()            # every engine built from now on

    with kvpool.vllm.enabled():      # only inside the block
        ...

    # no code change: the ``vllm.general_plugins`` entry point runs
    # ``plugin()`` in every vLLM process; it installs when KVPOOL_VLLM=1
    # (an unlisted release is an error: vLLM does not start), or, with
    # KVPOOL_VLLM=auto, where the release is listed (elsewhere it logs one
    # WARNING and vLLM runs unchanged: a fleet upgrade never stops on it).

Install before vLLM builds its engine: a ``KVCacheManager`` that already
exists keeps the pool it was built with. vLLM builds the scheduler in its
engine-core process, which it may *spawn* (a fresh interpreter that does not
inherit the patch); so ``install()`` also exports ``KVPOOL_VLLM`` for the
processes started while it is in effect, whose plugin loader then installs
kvpool there too (this needs kvpool pip-installed, for its entry point;
``auto`` is passed on as ``auto``, see ``plugin()``).

The modules: ``releases`` (the registry: lines, releases, what each puts
in), ``installer`` (install, uninstall, the plugin), ``events`` (the pool
queueing vLLM's event classes), ``hasher`` and ``manager`` (each rebinds one
name of vLLM's), ``logs`` (kvpool's lines in vLLM's log), ``__main__`` (the
report). vLLM is imported when one of them
is called, never by ``import kvpool`` or ``import kvpool.vllm``, and is not a
dependency of the core package.
"""

from __future__ import annotations

from . import installer, releases
from .installer import *
from .releases import *

__all__: list[str] = []
__all__ += installer.__all__
__all__ += releases.__all__
