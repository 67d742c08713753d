"""kvpool for vLLM 0.15.1 (and 0.16.x, whose pool files are identical): the
API the package's top level exports (``import kvpool`` is this line). Kept
as a namespace of its own so that code can name the line it targets, as it
names ``kvpool.v0_33``."""

from __future__ import annotations

from .. import *  # noqa: F403 -- the top level is this line
from .. import __all__ as __all__  # noqa: F401
