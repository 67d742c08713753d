"""kvpool's 0.33 KV-cache manager reads each single-type manager's request
tables (``req_to_blocks``, ``num_cached_block``, ``_partial_hit_reqs``)
through references bound when it is built -- vLLM binds them once, in
``__init__`` -- and rebinds them at every step's start
(``new_step_starts``). Code that replaces a table is seen from the next
step on; a table that is no longer a dict takes the manager out of the
compiled paths (vLLM's code serves it, with the reason set)."""

from __future__ import annotations

from collections import defaultdict

from _manager33 import BLOCK
from _manager33 import kvpool_manager as _manager
from _manager33 import new_request as _request


def test_a_replaced_table_is_used_from_the_next_step() -> None:
    w, mgr = _manager()
    single = mgr.coordinator.single_type_managers[0]
    a = _request(w, "a", 2 * BLOCK)
    assert mgr.allocate_slots(a, 2 * BLOCK) is not None
    old_blocks, old_cached = single.req_to_blocks, single.num_cached_block
    single.req_to_blocks = defaultdict(list, {k: list(v) for k, v in old_blocks.items()})
    single.num_cached_block = dict(old_cached)
    mgr.new_step_starts()
    a.num_computed_tokens = 2 * BLOCK
    a.append_output_token_ids(7)
    b = _request(w, "b", BLOCK)
    assert mgr.allocate_slots(b, BLOCK) is not None
    assert mgr.allocate_slots(a, 1) is not None
    # The new tables got the new block and the new request; the old ones
    # were not touched.
    assert len(single.req_to_blocks["a"]) == 3 and len(old_blocks["a"]) == 2
    assert "b" in single.req_to_blocks and "b" not in old_blocks
    assert single.num_cached_block["b"] == 1 and "b" not in old_cached
    assert mgr._kvpool_plan.counts["fast"] == 3
    mgr.free(b)
    assert "b" not in single.req_to_blocks


def test_a_table_that_is_not_a_dict_hands_the_manager_to_vllm() -> None:
    w, mgr = _manager()
    single = mgr.coordinator.single_type_managers[0]

    class Tables(defaultdict):
        pass

    # Still a dict: the compiled paths go on (a subclass's own methods are not
    # called by them, as vLLM's code calls none but item access).
    single.req_to_blocks = Tables(list)
    mgr.new_step_starts()
    assert mgr.kvpool_fallback_reason is None

    class NotADict:
        def __init__(self) -> None:
            self.d = defaultdict(list)

        def __getitem__(self, key):
            return self.d[key]

        def get(self, key, default=None):
            return self.d.get(key, default)

        def pop(self, key, *default):
            return self.d.pop(key, *default)

        def __contains__(self, key):
            return key in self.d

        def items(self):
            return self.d.items()

        def values(self):
            return self.d.values()

    single.req_to_blocks = NotADict()
    mgr.new_step_starts()
    assert mgr._kvpool_plan is None and mgr.coordinator._kvpool_plan is None
    assert mgr.kvpool_fallback_reason == "request tables that are not dicts"
    a = _request(w, "a", 2 * BLOCK)
    free = mgr.block_pool.get_num_free_blocks()
    assert mgr.allocate_slots(a, 2 * BLOCK) is not None  # vLLM's method
    assert len(single.req_to_blocks["a"]) == 2
    assert mgr.block_pool.get_num_free_blocks() == free - 2
    mgr.free(a)
    assert mgr.block_pool.get_num_free_blocks() == free
