"""The README's usage example runs as written (against the core in use)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_usage_example_runs():
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    example = next(b for b in blocks if "from kvpool import BlockPool" in b)
    namespace: dict = {}
    exec(compile(example, str(README), "exec"), namespace)
    assert namespace["hit"] == namespace["blocks"]
    assert [type(e).__name__ for e in namespace["events"]] == ["BlockStored"]
