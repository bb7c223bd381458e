/*
 * tcc.store._fast -- byte helpers for the store's commit path.
 *
 * The store cuts every snapshot payload by content and re-uses the cuts of
 * the previous payload wherever the bytes did not change (tcc/store/_chunks.py).
 * Finding where two payloads stop agreeing is a memcmp; done from Python it
 * costs a slice object and a method call per probe, about 15 us per search on
 * a 100 KiB payload.  This module does the search in one call.
 *
 * Everything here is optional: tcc/store/_chunks.py has a pure-Python
 * equivalent and uses it when this module is missing.  Both must give the
 * same answers (tests/store/test_store_fast.py checks them against each
 * other).  Nothing here touches interpreter internals; buffers are read
 * through the buffer protocol, with every offset checked first.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

/* Length of the common prefix of a[0:n] and b[0:n]. */
static Py_ssize_t
prefix_len(const unsigned char *a, const unsigned char *b, Py_ssize_t n)
{
    Py_ssize_t lo = 0;
    /* Compare in blocks with memcmp (vectorised by libc), then find the byte. */
    const Py_ssize_t block = 256;
    while (n - lo >= block && memcmp(a + lo, b + lo, (size_t)block) == 0) {
        lo += block;
    }
    while (lo < n && a[lo] == b[lo]) {
        lo++;
    }
    return lo;
}

PyDoc_STRVAR(common_len_doc,
"common_len(a, a_start, b, b_start) -> int\n\n"
"Length of the longest common prefix of a[a_start:] and b[b_start:].\n"
"a and b are bytes-like objects; a start outside 0..len raises ValueError.");

static PyObject *
tcc_common_len(PyObject *self, PyObject *args)
{
    Py_buffer a, b;
    Py_ssize_t a_start, b_start;
    if (!PyArg_ParseTuple(args, "y*ny*n:common_len", &a, &a_start, &b, &b_start)) {
        return NULL;
    }
    PyObject *result = NULL;
    if (a_start < 0 || a_start > a.len) {
        PyErr_Format(PyExc_ValueError, "common_len: a_start %zd is outside 0..%zd",
                     a_start, a.len);
        goto done;
    }
    if (b_start < 0 || b_start > b.len) {
        PyErr_Format(PyExc_ValueError, "common_len: b_start %zd is outside 0..%zd",
                     b_start, b.len);
        goto done;
    }
    Py_ssize_t n = a.len - a_start;
    if (b.len - b_start < n) {
        n = b.len - b_start;
    }
    result = PyLong_FromSsize_t(prefix_len((const unsigned char *)a.buf + a_start,
                                           (const unsigned char *)b.buf + b_start, n));
done:
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return result;
}

static PyMethodDef fast_methods[] = {
    {"common_len", tcc_common_len, METH_VARARGS, common_len_doc},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot fast_slots[] = {
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#if PY_VERSION_HEX >= 0x030D0000
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef fast_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tcc.store._fast",
    .m_doc = "Byte helpers for the store's commit path (optional; see _chunks.py).",
    .m_size = 0,
    .m_methods = fast_methods,
    .m_slots = fast_slots,
};

PyMODINIT_FUNC
PyInit__fast(void)
{
    return PyModuleDef_Init(&fast_module);
}
