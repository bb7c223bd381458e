# Stub for the optional C helper built from native/tcc_store.c.  The C function
# takes any bytes-like objects; this stub states how the store calls it, the
# same signature as its pure-Python form ``_chunks._py_common``.
def common_len(a: bytes, a_start: int, b: memoryview, b_start: int, /) -> int: ...
