"""Values of the core's release rules that are not plain flags, shared by
both cores (``_core.pyx`` and ``_core_py.py``), so that the two accept the
same names and map them to the same codes (see ``PoolCore`` for the rules).
"""

from __future__ import annotations

__all__ = ["FREE_CACHING_OFF", "free_caching_off_rule"]

#: Rule ``_kvpool_free_caching_off``: its values and their codes (the
#: compiled core's ``_FREE_OFF_*`` constants are these numbers).
FREE_CACHING_OFF = {"front": 0, "by_hash": 1, "back": 2}


def free_caching_off_rule(cls: type) -> int:
    """``cls._kvpool_free_caching_off`` as its ``FREE_CACHING_OFF`` code;
    ``ValueError`` for any other value."""
    name = cls._kvpool_free_caching_off
    rule = FREE_CACHING_OFF.get(name) if isinstance(name, str) else None
    if rule is None:
        raise ValueError(
            f"{cls.__name__}._kvpool_free_caching_off must be one of "
            f"{sorted(FREE_CACHING_OFF)}, got {name!r}"
        )
    return rule
