# The caching step (_caching.pyx), for allocate_slots' end.

from kvpool._plan cimport ManagerPlan


cdef int _cache(ManagerPlan p, object request, object rid, Py_ssize_t num_tokens,
                bint cap_at_num_tokens) except -1
