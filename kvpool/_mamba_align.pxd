# A Mamba group in "align" mode and copy-on-write (_mamba_align.pyx): what
# allocate_slots and the caching step call.

from kvpool._plan cimport _Group, ManagerPlan


cdef bint _align_has_left(ManagerPlan p, _Group g, object rid, Py_ssize_t processed) except -1

cdef bint _align_tail_idle(ManagerPlan p, _Group g, object request, object rid,
                           Py_ssize_t num_tokens) except -1

cdef bint _cow_ok(_Group g, list hits, Py_ssize_t num_local_computed) except -1

cdef bint _align_steady(ManagerPlan p, object rid, Py_ssize_t main_tokens,
                        object adopt) except -1

cdef Py_ssize_t _align_count(ManagerPlan p, _Group g, object rid, Py_ssize_t start,
                             Py_ssize_t main_tokens, Py_ssize_t prefill_end, object hits,
                             bint partial, bint record) except? -1

cdef list _align_new_blocks(ManagerPlan p, _Group g, object rid, list blocks,
                            Py_ssize_t main_tokens)

cdef bint _align_counts_ok(ManagerPlan p, object rid) except -1

cdef list _cow_new_blocks(ManagerPlan p, _Group g, object rid, list blocks, Py_ssize_t nnew)

# Mamba caching (issue 52)
cdef bint _align_tail_none(ManagerPlan p, _Group g, object request, object rid,
                           Py_ssize_t n) except -1

cdef object _align_mask(ManagerPlan p, _Group g, object request, Py_ssize_t start,
                        Py_ssize_t end, object retention, bint *ok)

cdef object _align_tail(ManagerPlan p, _Group g, object request, object rid, Py_ssize_t n,
                        object retention)
