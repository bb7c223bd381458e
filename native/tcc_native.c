/*
 * tcc._native -- read and write the interpreter frame of a suspended
 * generator or coroutine.
 *
 * This module is deliberately small.  It knows nothing about pickling,
 * fingerprints or stores: it turns a generator's frame into plain Python
 * values (read_frame) and writes such values into the frame of a *fresh*
 * generator made from the same code object (write_frame).  Everything that
 * decides whether a record may be trusted lives in Python
 * (tcc.capture); everything that could corrupt interpreter memory is checked
 * here again, in C, immediately before the write, because this is the last
 * line of defence and must hold even if the Python layer has a bug.
 *
 * Versions: CPython 3.11, 3.12, 3.13.  Every version difference is a macro in
 * tcc_compat.h; this file should read the same on all three.
 *
 * A "record" is, for one frame:
 *   state      TCC_CREATED / TCC_SUSPENDED (and, from read_frame only,
 *              TCC_RUNNING / TCC_FINISHED, which cannot be written)
 *   offset     index (in code units) of the YIELD_VALUE the frame is
 *              suspended at, or -1 for a frame that has not started
 *   slots      tuple: localsplus[0:stacktop] -- locals, cells, free
 *              variables, then the value stack.  A C NULL in a slot is a
 *              legal, meaningful value (unbound local, the NULL that
 *              method calls push) and is represented by the caller's
 *              `null` marker object, never by None.
 *   exc        the generator's saved exception state (gi_exc_state.exc_value):
 *              the exception being handled when the frame was suspended in
 *              an `except` block.  NULL is again the `null` marker.
 *   func       the function object the frame runs (read only).
 *
 * check_kinds() is a predicate for the Python flow analysis
 * (tcc/capture/_flow.py), which knows which value-stack slots the bytecode
 * uses without a type check but must not test them with isinstance(): it
 * applies the interpreter's own type tests to the objects' real types.  It
 * runs, like check_frame(), before any frame is written.
 */
#include "tcc_compat.h"

/* Normalised states, shared with tcc/capture/_frames.py. */
enum {
    TCC_CREATED = 0,
    TCC_SUSPENDED = 1,
    TCC_RUNNING = 2,
    TCC_FINISHED = 3,
};

static int
is_generator_like(PyObject *obj)
{
    /* Exact types only: a subclass could not exist (these types are final),
     * but a foreign object that merely looks like a generator must never be
     * cast to PyGenObject. */
    return PyGen_CheckExact(obj) || PyCoro_CheckExact(obj);
}

static _PyInterpreterFrame *
gen_frame(PyGenObject *gen)
{
    return (_PyInterpreterFrame *)gen->gi_iframe;
}

/* ------------------------------------------------------------------------ */
/* read_frame(gen, null) -> (state, offset, slots, exc, func)                 */
/* ------------------------------------------------------------------------ */

static PyObject *
tcc_read_frame(PyObject *module, PyObject *args)
{
    PyObject *obj, *null_marker;
    if (!PyArg_ParseTuple(args, "OO:read_frame", &obj, &null_marker)) {
        return NULL;
    }
    if (!is_generator_like(obj)) {
        PyErr_Format(PyExc_TypeError,
                     "read_frame() expects a generator or coroutine, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return NULL;
    }
    PyGenObject *gen = (PyGenObject *)obj;
    int state = gen->gi_frame_state;

    if (state >= FRAME_COMPLETED) {
        /* The frame has been cleared: nothing in it may be read. */
        return Py_BuildValue("(iiOOO)", TCC_FINISHED, -1, Py_None, Py_None,
                             Py_None);
    }
    if (state == FRAME_EXECUTING) {
        /* A running frame's stack pointer lives in a C local of the eval
         * loop, so `stacktop` is stale: reading it would be a lie. */
        return Py_BuildValue("(iiOOO)", TCC_RUNNING, -1, Py_None, Py_None,
                             Py_None);
    }

    _PyInterpreterFrame *f = gen_frame(gen);
    PyCodeObject *co = TCC_FRAME_CODE(f);
    int nlocalsplus = co->co_nlocalsplus;
    int top = f->stacktop;
    if (top < nlocalsplus || top > nlocalsplus + co->co_stacksize) {
        PyErr_Format(PyExc_SystemError,
                     "tcc: frame of %U has stack top %d outside [%d, %d]; "
                     "please report this",
                     co->co_qualname, top, nlocalsplus,
                     nlocalsplus + co->co_stacksize);
        return NULL;
    }

    int out_state, offset;
    if (state == FRAME_CREATED) {
        out_state = TCC_CREATED;
        offset = -1;
    }
    else if (TCC_IS_SUSPENDED(state)) {
        out_state = TCC_SUSPENDED;
        Py_ssize_t idx = TCC_FRAME_INSTR(f) - _PyCode_CODE(co)
                         - TCC_SUSPEND_ADJUST;
        if (idx < 0 || idx >= Py_SIZE(co)) {
            PyErr_Format(PyExc_SystemError,
                         "tcc: suspended frame of %U points outside its code; "
                         "please report this", co->co_qualname);
            return NULL;
        }
        offset = (int)idx;
    }
    else {
        PyErr_Format(PyExc_SystemError,
                     "tcc: unknown generator frame state %d; please report this",
                     state);
        return NULL;
    }

    PyObject *slots = PyTuple_New(top);
    if (slots == NULL) {
        return NULL;
    }
    for (int i = 0; i < top; i++) {
        PyObject *v = f->localsplus[i];
        PyTuple_SET_ITEM(slots, i, Py_NewRef(v != NULL ? v : null_marker));
    }
    PyObject *exc = gen->gi_exc_state.exc_value;
    PyObject *func = TCC_FRAME_FUNC(f);
    PyObject *result = Py_BuildValue(
        "(iiNOO)", out_state, offset, slots,
        exc != NULL ? exc : null_marker,
        func != NULL ? func : Py_None);
    return result;
}

/* ------------------------------------------------------------------------ */
/* write_frame(gen, code, state, offset, slots, exc, null) -> None            */
/* ------------------------------------------------------------------------ */

/* Check that `offset` names a YIELD_VALUE followed by a RESUME in the
 * de-specialised bytecode of `co`, and say whether that suspension point is
 * inside `yield from` / `await` (then the delegate iterator must be on top of
 * the value stack, because gen.send()/throw()/close() read it from there).
 *
 * We read PyCode_GetCode() rather than the live code array: the live array
 * may hold specialised or instrumented opcodes (sys.monitoring, 3.12+), the
 * de-specialised copy holds the canonical ones.  In that copy every code unit
 * is either an instruction or an inline-cache unit whose opcode byte is
 * CACHE (0), so a unit whose opcode byte is YIELD_VALUE is a real
 * YIELD_VALUE instruction -- it cannot be a stray argument byte.
 *
 * Returns 1 (yield-from point), 0 (plain yield) or -1 with an exception set.
 * On 3.13 *frame_state receives the exact FRAME_SUSPENDED* value to store. */
static int
check_suspension_point(PyCodeObject *co, int offset, int *frame_state)
{
    PyObject *raw = PyCode_GetCode(co);
    if (raw == NULL) {
        return -1;
    }
    Py_ssize_t nunits = PyBytes_GET_SIZE(raw) / 2;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(raw);
    int result = -1;

    if (offset < 0 || offset + 1 >= nunits) {
        PyErr_Format(PyExc_ValueError,
                     "offset %d is outside the code of %U (%zd code units)",
                     offset, co->co_qualname, nunits);
        goto done;
    }
    int op = b[2 * offset], arg = b[2 * offset + 1];
    int next_op = b[2 * offset + 2], next_arg = b[2 * offset + 3];
    if (op != YIELD_VALUE || next_op != RESUME) {
        PyErr_Format(PyExc_ValueError,
                     "offset %d of %U is not a suspension point "
                     "(opcode %d, expected YIELD_VALUE followed by RESUME)",
                     offset, co->co_qualname, op);
        goto done;
    }
#if TCC_PY313
    if (arg != 0 && arg != 1) {
        PyErr_Format(PyExc_ValueError,
                     "YIELD_VALUE at offset %d of %U has oparg %d",
                     offset, co->co_qualname, arg);
        goto done;
    }
    *frame_state = FRAME_SUSPENDED + arg;
    result = arg;
    (void)next_arg;
#else
    (void)arg;
    *frame_state = FRAME_SUSPENDED;
    result = next_arg >= 2;
#endif
done:
    Py_DECREF(raw);
    return result;
}

/* Whether local slot `index` of `co` can be one an inlined comprehension (3.12+)
 * cleared to use as a plain local of its own, keeping the outer cell on the value
 * stack until it stores it back: the de-specialised bytecode has a LOAD_FAST_AND_CLEAR
 * of the slot, and no MAKE_CELL of it after the prologue (a comprehension whose own
 * variable is a cell makes a new cell there, and reads the slot as one).  0 on 3.11,
 * -1 with an exception set. */
static int
clears_slot(PyCodeObject *co, int index)
{
#ifdef LOAD_FAST_AND_CLEAR
    PyObject *raw = PyCode_GetCode(co);
    if (raw == NULL) {
        return -1;
    }
    Py_ssize_t nunits = PyBytes_GET_SIZE(raw) / 2;
    const unsigned char *b = (const unsigned char *)PyBytes_AS_STRING(raw);
    int cleared = 0, remade = 0, prologue = 1;
    long ext = 0;
    for (Py_ssize_t u = 0; u < nunits; u++) {
        int op = b[2 * u];
        long arg = (ext << 8) | b[2 * u + 1];
        if (op == EXTENDED_ARG) {
            ext = arg;
            continue;
        }
        ext = 0;
        if (op == RESUME) {
            prologue = 0;
        }
        else if (op == LOAD_FAST_AND_CLEAR && arg == index) {
            cleared = 1;
        }
        else if (op == MAKE_CELL && arg == index && !prologue) {
            remade = 1;
        }
    }
    Py_DECREF(raw);
    return cleared && !remade;
#else
    (void)co;
    (void)index;
    return 0;
#endif
}

/* Validate a record against a target generator without touching it.
 * `shadowed` (NULL, None or bytes of one flag per slot of the record) carries what
 * the caller's flow analysis found of an inlined comprehension at this suspension
 * point: 1 on a cell slot it cleared (which may then hold a plain value or NULL, if
 * the code clears it that way at all: clears_slot), 2 on the value-stack slot that
 * keeps the cell until the comprehension stores it back (which must hold a cell).
 * On success returns 0 and stores the frame state to write; on failure
 * returns -1 with an exception set. */
static int
validate_record(PyObject *obj, PyObject *code, int state, int offset,
                PyObject *slots, PyObject **exc_inout, PyObject *null_marker,
                PyObject *shadowed, int *new_frame_state)
{
    if (!is_generator_like(obj)) {
        PyErr_Format(PyExc_TypeError,
                     "write_frame() expects a generator or coroutine, not %.100s",
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    PyGenObject *gen = (PyGenObject *)obj;
    if (gen->gi_frame_state != FRAME_CREATED) {
        PyErr_SetString(PyExc_ValueError,
                        "target generator is not fresh: it has already started "
                        "or finished");
        return -1;
    }
    _PyInterpreterFrame *f = gen_frame(gen);
    PyCodeObject *co = TCC_FRAME_CODE(f);
    if ((PyObject *)co != code) {
        PyErr_Format(PyExc_ValueError,
                     "target generator runs %U, not the code of the record",
                     co->co_qualname);
        return -1;
    }

    Py_ssize_t n = PyTuple_GET_SIZE(slots);
    int nlocalsplus = co->co_nlocalsplus;
    if (n < nlocalsplus || n > (Py_ssize_t)nlocalsplus + co->co_stacksize) {
        PyErr_Format(PyExc_ValueError,
                     "record of %U has %zd slots; the code needs between %d "
                     "and %d", co->co_qualname, n, nlocalsplus,
                     nlocalsplus + co->co_stacksize);
        return -1;
    }

    if (state == TCC_CREATED) {
        if (offset != -1 || n != f->stacktop) {
            PyErr_Format(PyExc_ValueError,
                         "record of unstarted %U must have offset -1 and %d "
                         "slots", co->co_qualname, f->stacktop);
            return -1;
        }
        *new_frame_state = FRAME_CREATED;
    }
    else if (state == TCC_SUSPENDED) {
        int yf = check_suspension_point(co, offset, new_frame_state);
        if (yf < 0) {
            return -1;
        }
        if (yf && n <= nlocalsplus) {
            PyErr_Format(PyExc_ValueError,
                         "record of %U is suspended in 'yield from'/'await' at "
                         "offset %d but its value stack is empty",
                         co->co_qualname, offset);
            return -1;
        }
    }
    else {
        PyErr_Format(PyExc_ValueError, "state %d cannot be written", state);
        return -1;
    }

    /* Cell and free-variable slots are dereferenced without a type check by
     * LOAD_DEREF / STORE_DEREF, so they must hold real cell objects.  The
     * prologue (MAKE_CELL, COPY_FREE_VARS) runs before RETURN_GENERATOR, so
     * this holds for unstarted frames too. */
    const unsigned char *kinds =
        (const unsigned char *)PyBytes_AS_STRING(co->co_localspluskinds);
    const char *shadow = NULL;
    int saved_cells = 0;  /* stack slots flagged 2, each checked to hold a cell */
    if (shadowed != NULL && shadowed != Py_None) {
        if (!PyBytes_Check(shadowed) || PyBytes_GET_SIZE(shadowed) != n) {
            PyErr_Format(PyExc_TypeError,
                         "shadowed slots of %U must be bytes of length %zd",
                         co->co_qualname, n);
            return -1;
        }
        shadow = PyBytes_AS_STRING(shadowed);
        for (Py_ssize_t i = nlocalsplus; i < n; i++) {
            if (shadow[i] == 2) {
                PyObject *v = PyTuple_GET_ITEM(slots, i);
                if (!PyCell_Check(v)) {
                    PyErr_Format(PyExc_ValueError,
                                 "stack slot %zd of %U keeps a comprehension's saved "
                                 "cell and must hold a cell, not %.100s",
                                 i - nlocalsplus, co->co_qualname,
                                 v == null_marker ? "NULL" : Py_TYPE(v)->tp_name);
                    return -1;
                }
                saved_cells++;
            }
        }
    }
    for (int i = 0; i < nlocalsplus; i++) {
        if (kinds[i] & (CO_FAST_CELL | CO_FAST_FREE)) {
            PyObject *v = PyTuple_GET_ITEM(slots, i);
            if (!PyCell_Check(v) && shadow != NULL && shadow[i] == 1 && saved_cells > 0) {
                int cleared = clears_slot(co, i);
                if (cleared < 0) {
                    return -1;
                }
                if (cleared) {
                    continue;  /* the cell waits on the value stack */
                }
            }
            if (!PyCell_Check(v)) {
                PyObject *name = PyTuple_GetItem(co->co_localsplusnames, i);
                PyErr_Format(PyExc_ValueError,
                             "slot %d (%R) of %U must hold a cell, not %.100s",
                             i, name, co->co_qualname,
                             v == null_marker ? "NULL" : Py_TYPE(v)->tp_name);
                return -1;
            }
        }
    }

    PyObject *exc = *exc_inout;
    if (exc == null_marker) {
        *exc_inout = NULL;
    }
    else if (exc != Py_None && !PyExceptionInstance_Check(exc)) {
        PyErr_Format(PyExc_TypeError,
                     "saved exception state of %U must be an exception or "
                     "None, not %.100s", co->co_qualname, Py_TYPE(exc)->tp_name);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* check_kinds(slots, kinds, null, lasti_max) -> index of a bad slot, or -1   */
/* ------------------------------------------------------------------------ */

/* What a slot must hold because some instruction uses it without a type
 * check (flags, shared with tcc/capture/_flow.py, which finds the slots by
 * bytecode flow analysis).  These are the interpreter's own tests, applied to
 * the object's real type: a `__class__` property or a metaclass `__getattr__`
 * cannot fake them, which isinstance() or getattr(type(v), ...) would let
 * them do. */
enum {
    TCC_KIND_ITER = 1 << 0,         /* FOR_ITER calls tp_iternext directly */
    TCC_KIND_EXC = 1 << 1,          /* an exception instance */
    TCC_KIND_EXC_OR_NONE = 1 << 2,  /* an exception instance or None */
    TCC_KIND_LASTI = 1 << 3,        /* an exact int in [0, lasti_max] */
    TCC_KIND_LIST = 1 << 4,         /* exact types: the interpreter casts */
    TCC_KIND_SET = 1 << 5,
    TCC_KIND_DICT = 1 << 6,
    TCC_KIND_TUPLE = 1 << 7,
    TCC_KIND_EXC_ITEMS = 1 << 8,    /* a list of exceptions or None (except*) */
    TCC_KIND_ALL = (1 << 9) - 1,
};

static int
is_exception_or_none(PyObject *v)
{
    return v == Py_None || PyExceptionInstance_Check(v);
}

/* 1 if `v` has every kind in `kinds`, 0 if not, -1 with an exception set. */
static int
has_kinds(PyObject *v, long kinds, long lasti_max)
{
    if ((kinds & TCC_KIND_ITER) && !PyIter_Check(v)) {
        return 0;
    }
    if ((kinds & TCC_KIND_EXC) && !PyExceptionInstance_Check(v)) {
        return 0;
    }
    if ((kinds & TCC_KIND_EXC_OR_NONE) && !is_exception_or_none(v)) {
        return 0;
    }
    if (kinds & TCC_KIND_LASTI) {
        if (!PyLong_CheckExact(v)) {
            return 0;
        }
        int overflow;
        long value = PyLong_AsLongAndOverflow(v, &overflow);
        if (value == -1 && PyErr_Occurred()) {
            return -1;
        }
        if (overflow || value < 0 || value > lasti_max) {
            return 0;
        }
    }
    if ((kinds & (TCC_KIND_LIST | TCC_KIND_EXC_ITEMS)) && !PyList_CheckExact(v)) {
        return 0;
    }
    if ((kinds & TCC_KIND_SET) && !PySet_CheckExact(v)) {
        return 0;
    }
    if ((kinds & TCC_KIND_DICT) && !PyDict_CheckExact(v)) {
        return 0;
    }
    if ((kinds & TCC_KIND_TUPLE) && !PyTuple_CheckExact(v)) {
        return 0;
    }
    if (kinds & TCC_KIND_EXC_ITEMS) {
        /* Checking the items runs no Python code, so the list cannot change
         * while it is walked. */
        for (Py_ssize_t j = 0; j < PyList_GET_SIZE(v); j++) {
            if (!is_exception_or_none(PyList_GET_ITEM(v, j))) {
                return 0;
            }
        }
    }
    return 1;
}

static PyObject *
tcc_check_kinds(PyObject *module, PyObject *args)
{
    PyObject *slots, *kinds, *null_marker;
    long lasti_max;
    if (!PyArg_ParseTuple(args, "O!O!Ol:check_kinds", &PyTuple_Type, &slots,
                          &PyTuple_Type, &kinds, &null_marker, &lasti_max)) {
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(slots);
    if (PyTuple_GET_SIZE(kinds) < n) {
        n = PyTuple_GET_SIZE(kinds);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *k = PyTuple_GET_ITEM(kinds, i);
        if (!PyLong_CheckExact(k)) {
            PyErr_SetString(PyExc_TypeError, "check_kinds() needs int kinds");
            return NULL;
        }
        long want = PyLong_AsLong(k);
        if (want == -1 && PyErr_Occurred()) {
            return NULL;
        }
        if (want < 0 || (want & ~(long)TCC_KIND_ALL)) {
            PyErr_Format(PyExc_ValueError, "unknown slot kind %ld", want);
            return NULL;
        }
        PyObject *v = PyTuple_GET_ITEM(slots, i);
        if (want == 0 || v == null_marker) {
            continue;  /* NULL slots are the flow analysis's business */
        }
        int ok = has_kinds(v, want, lasti_max);
        if (ok < 0) {
            return NULL;
        }
        if (!ok) {
            return PyLong_FromSsize_t(i);
        }
    }
    return PyLong_FromLong(-1);
}

#define RECORD_ARGS_FORMAT "OO!iiO!OO|O"

static PyObject *
tcc_check_frame(PyObject *module, PyObject *args)
{
    PyObject *obj, *code, *slots, *exc, *null_marker, *shadowed = NULL;
    int state, offset, new_frame_state;
    if (!PyArg_ParseTuple(args, RECORD_ARGS_FORMAT ":check_frame", &obj,
                          &PyCode_Type, &code, &state, &offset,
                          &PyTuple_Type, &slots, &exc, &null_marker, &shadowed)) {
        return NULL;
    }
    if (validate_record(obj, code, state, offset, slots, &exc, null_marker,
                        shadowed, &new_frame_state) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
tcc_write_frame(PyObject *module, PyObject *args)
{
    PyObject *obj, *code, *slots, *exc, *null_marker, *shadowed = NULL;
    int state, offset, new_frame_state;
    if (!PyArg_ParseTuple(args, RECORD_ARGS_FORMAT ":write_frame", &obj,
                          &PyCode_Type, &code, &state, &offset,
                          &PyTuple_Type, &slots, &exc, &null_marker, &shadowed)) {
        return NULL;
    }
    /* Validation is repeated here even when the caller ran check_frame():
     * it is cheap, and it is the only thing standing between a bad record
     * and interpreter memory. */
    if (validate_record(obj, code, state, offset, slots, &exc, null_marker,
                        shadowed, &new_frame_state) < 0) {
        return NULL;
    }
    PyGenObject *gen = (PyGenObject *)obj;
    _PyInterpreterFrame *f = gen_frame(gen);
    PyCodeObject *co = TCC_FRAME_CODE(f);
    Py_ssize_t n = PyTuple_GET_SIZE(slots);

    /* ---- write ---------------------------------------------------------- *
     * Old slot values are released only after the frame is consistent again:
     * a decref can run arbitrary Python code (__del__, weakref callbacks). */
    int old_top = f->stacktop;
    PyObject *old = PyTuple_New(old_top);
    if (old == NULL) {
        return NULL;
    }
    for (int i = 0; i < old_top; i++) {
        PyObject *v = f->localsplus[i];
        /* The tuple takes over the frame's reference (NULL slots stay
         * NULL, which tuple deallocation tolerates). */
        PyTuple_SET_ITEM(old, i, v);
        f->localsplus[i] = NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyTuple_GET_ITEM(slots, i);
        f->localsplus[i] = (v == null_marker) ? NULL : Py_NewRef(v);
    }
    f->stacktop = (int)n;
    if (state == TCC_SUSPENDED) {
        TCC_FRAME_INSTR(f) = _PyCode_CODE(co) + offset + TCC_SUSPEND_ADJUST;
    }
    gen->gi_frame_state = (int8_t)new_frame_state;
    PyObject *old_exc = gen->gi_exc_state.exc_value;
    gen->gi_exc_state.exc_value = Py_XNewRef(exc);

    Py_XDECREF(old_exc);
    Py_DECREF(old);
    Py_RETURN_NONE;
}

/* ---- segments of long lists (tcc.capture._segments) --------------------- *
 *
 * A snapshot of a long list whose first items have not changed since the
 * previous snapshot reuses their serialised form.  "Not changed" is decided
 * here, without touching any item's contents:
 *
 *   - the list holds, at [start, start + n), exactly the objects recorded
 *     then (pointer equality, which the recorded tuple keeps alive);
 *   - every item that is an exact dict still has the version tag recorded
 *     then: CPython 3.11-3.13 give a dict a new, globally unique tag on every
 *     change (PEP 509), and the dict's values are immutable (checked in
 *     Python when the segment was recorded);
 *   - every such dict is referenced only by the list and the recorded tuple
 *     (refcount 2): a dict that something else also holds would be rebuilt as
 *     a copy, so the segment may not stand for it.
 *
 * Nothing is written; any argument of the wrong kind gives False or TypeError.
 */

#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
#endif
static inline uint64_t
tcc_dict_tag(PyObject *d)
{
    return ((PyDictObject *)d)->ma_version_tag;
}
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif

static PyObject *
tcc_dict_version(PyObject *module, PyObject *arg)
{
    if (!PyDict_CheckExact(arg)) {
        PyErr_SetString(PyExc_TypeError, "dict_version() needs an exact dict");
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(tcc_dict_tag(arg));
}

/* Where a memoryview's memory starts in the buffer its exporter gives now: the byte
 * offset, or None when the exporter gives no simple contiguous buffer or the view's memory
 * is not inside it.  Reads two pointers; touches neither buffer's memory. */
static PyObject *
tcc_view_offset(PyObject *module, PyObject *args)
{
    PyObject *view, *exporter;
    if (!PyArg_ParseTuple(args, "O!O:view_offset", &PyMemoryView_Type, &view, &exporter)) {
        return NULL;
    }
    Py_buffer mine;
    if (PyObject_GetBuffer(view, &mine, PyBUF_FULL_RO) < 0) {
        return NULL;  /* a released view: ValueError */
    }
    Py_buffer base;
    if (PyObject_GetBuffer(exporter, &base, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&mine);
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    char *start = (char *)mine.buf, *low = (char *)base.buf;
    Py_ssize_t len = mine.len, total = base.len;
    PyBuffer_Release(&base);
    PyBuffer_Release(&mine);
    if (start < low || start - low > total || len > total - (start - low)) {
        Py_RETURN_NONE;
    }
    return PyLong_FromSsize_t(start - low);
}

static PyObject *
tcc_segment_unchanged(PyObject *module, PyObject *args)
{
    PyObject *list, *items, *versions;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!nO!O!:segment_unchanged", &PyList_Type, &list, &start,
                          &PyTuple_Type, &items, &PyTuple_Type, &versions)) {
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    if (PyTuple_GET_SIZE(versions) != n) {
        PyErr_SetString(PyExc_ValueError, "segment_unchanged(): items and versions differ in length");
        return NULL;
    }
    if (start < 0 || n > PyList_GET_SIZE(list) || start > PyList_GET_SIZE(list) - n) {
        Py_RETURN_FALSE;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (PyList_GET_ITEM(list, start + i) != item) {
            Py_RETURN_FALSE;
        }
        PyObject *tag = PyTuple_GET_ITEM(versions, i);
        if (tag == Py_None) {
            continue;
        }
        if (!PyDict_CheckExact(item) || !PyLong_CheckExact(tag) || Py_REFCNT(item) != 2) {
            Py_RETURN_FALSE;
        }
        unsigned long long want = PyLong_AsUnsignedLongLong(tag);
        if (want == (unsigned long long)-1 && PyErr_Occurred()) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        if (tcc_dict_tag(item) != (uint64_t)want) {
            Py_RETURN_FALSE;
        }
    }
    Py_RETURN_TRUE;
}

/* segment_shared(list, start, items): the indices i of the exact dicts among ``items``
 * that something besides the list and ``items`` also holds (a local, another list), or
 * that the list holds at a position other than start + i.  A segment pickled on its own
 * would restore such a dict as a copy, so tcc.capture._segments pickles them with the
 * rest of the state instead (the segment's "holes").  Reads reference counts and
 * pointers only; any argument of the wrong kind gives TypeError. */
static PyObject *
tcc_segment_shared(PyObject *module, PyObject *args)
{
    PyObject *list, *items;
    Py_ssize_t start;
    if (!PyArg_ParseTuple(args, "O!nO!:segment_shared", &PyList_Type, &list, &start,
                          &PyTuple_Type, &items)) {
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    if (start < 0 || n > PyList_GET_SIZE(list) || start > PyList_GET_SIZE(list) - n) {
        PyErr_SetString(PyExc_ValueError, "segment_shared(): items run past the list");
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (!PyDict_CheckExact(item)) {
            continue;
        }
        if (PyList_GET_ITEM(list, start + i) == item && Py_REFCNT(item) == 2) {
            continue;
        }
        PyObject *index = PyLong_FromSsize_t(i);
        if (index == NULL || PyList_Append(out, index) < 0) {
            Py_XDECREF(index);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(index);
    }
    PyObject *result = PyList_AsTuple(out);
    Py_DECREF(out);
    return result;
}

/* ---- dict watchers (3.12+): a segment's dicts report their own changes ---- *
 *
 * Checking each dict's version tag at every snapshot touches every message of a
 * long transcript: one cache miss per item, ~0.4 ms per step at 10,000 items.
 * On 3.12 and later a segment instead registers its dicts with one dict watcher
 * (PyDict_Watch); the first change of any of them (or a clone, a clear, its
 * deallocation) sets byte 0 of the segment's token, a bytearray.  A later
 * snapshot then compares only the list's item pointers and reads the token.
 *
 * ``tcc_watched`` maps a dict's address (an int) to the token of the segment
 * that watches it.  A dict stays watched until it is unwatched or freed; a dict
 * whose mapping was removed still fires the callback, which then finds nothing.
 * A segment that starts watching a dict another one watches marks the other's
 * token (the dict is shared: neither may stand for it).
 *
 * Sharing is not visible to a watcher: SegmentHook reports each watched dict
 * the pickler meets (see below), and tcc.capture._segments refuses a dump in
 * which a dict of a reused segment is also pickled elsewhere.
 */

#if PY_VERSION_HEX >= 0x030C0000
static int tcc_watcher = -1;      /* the watcher's id, or -1 */
static PyObject *tcc_watched;     /* dict: address -> token */
static unsigned long long tcc_watch_failures; /* callbacks that could not look a dict up */

static int
tcc_watch_callback(PyDict_WatchEvent event, PyObject *dict, PyObject *key, PyObject *value)
{
    (void)key;
    (void)value;
    if (tcc_watched == NULL) {
        return 0;
    }
    PyObject *exc = PyErr_GetRaisedException();
    PyObject *addr = PyLong_FromVoidPtr(dict);
    PyObject *token = addr != NULL ? PyDict_GetItemWithError(tcc_watched, addr) : NULL; /* borrowed */
    if (token != NULL && PyByteArray_CheckExact(token) && PyByteArray_GET_SIZE(token) > 0) {
        PyByteArray_AS_STRING(token)[0] = 1;
        if (event == PyDict_EVENT_DEALLOCATED && PyDict_DelItem(tcc_watched, addr) < 0) {
            tcc_watch_failures++;
        }
    }
    else if (PyErr_Occurred()) {
        /* the change could not be told to its segment: every token is suspect
         * (the Python side compares this count before reusing a segment) */
        tcc_watch_failures++;
    }
    Py_XDECREF(addr);
    PyErr_Clear(); /* a watcher callback must not raise */
    PyErr_SetRaisedException(exc);
    return 0;
}

static int
tcc_watch_ready(void)
{
    if (tcc_watcher >= 0) {
        return 1;
    }
    if (tcc_watched == NULL) {
        tcc_watched = PyDict_New();
        if (tcc_watched == NULL) {
            return -1;
        }
    }
    int id = PyDict_AddWatcher(tcc_watch_callback);
    if (id < 0) { /* all watcher slots taken: fall back to version tags */
        PyErr_Clear();
        return 0;
    }
    tcc_watcher = id;
    return 1;
}
#endif

static PyObject *
tcc_dict_watch(PyObject *module, PyObject *args)
{
    PyObject *items, *token;
    if (!PyArg_ParseTuple(args, "O!O!:dict_watch", &PyTuple_Type, &items, &PyByteArray_Type, &token)) {
        return NULL;
    }
    if (PyByteArray_GET_SIZE(token) < 1) {
        PyErr_SetString(PyExc_ValueError, "dict_watch(): the token must hold at least one byte");
        return NULL;
    }
#if PY_VERSION_HEX >= 0x030C0000
    int ready = tcc_watch_ready();
    if (ready < 0) {
        return NULL;
    }
    if (ready == 0) {
        Py_RETURN_FALSE;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (!PyDict_CheckExact(item)) {
            continue;
        }
        PyObject *addr = PyLong_FromVoidPtr(item);
        if (addr == NULL) {
            return NULL;
        }
        /* A dict another segment watches is shared: that segment may no longer be
         * reused (and this one is refused by its reference count). */
        PyObject *other = PyDict_GetItemWithError(tcc_watched, addr); /* borrowed */
        if (other != NULL && other != token && PyByteArray_CheckExact(other)
                && PyByteArray_GET_SIZE(other) > 0) {
            PyByteArray_AS_STRING(other)[0] = 1;
        }
        else if (other == NULL && PyErr_Occurred()) {
            Py_DECREF(addr);
            return NULL;
        }
        int rc = PyDict_SetItem(tcc_watched, addr, token);
        Py_DECREF(addr);
        if (rc < 0 || PyDict_Watch(tcc_watcher, item) < 0) {
            return NULL;
        }
    }
    Py_RETURN_TRUE;
#else
    (void)items;
    Py_RETURN_FALSE;
#endif
}

static PyObject *
tcc_dict_unwatch(PyObject *module, PyObject *args)
{
    PyObject *items, *token;
    if (!PyArg_ParseTuple(args, "O!O:dict_unwatch", &PyTuple_Type, &items, &token)) {
        return NULL;
    }
#if PY_VERSION_HEX >= 0x030C0000
    if (tcc_watcher < 0 || tcc_watched == NULL) {
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyTuple_GET_ITEM(items, i);
        if (!PyDict_CheckExact(item)) {
            continue;
        }
        PyObject *addr = PyLong_FromVoidPtr(item);
        if (addr == NULL) {
            return NULL;
        }
        PyObject *mine = PyDict_GetItemWithError(tcc_watched, addr); /* borrowed */
        int rc = 0;
        if (mine == token) { /* only this segment's registration */
            rc = PyDict_DelItem(tcc_watched, addr);
            if (rc == 0) {
                rc = PyDict_Unwatch(tcc_watcher, item);
            }
        }
        else if (mine == NULL && PyErr_Occurred()) {
            rc = -1;
        }
        Py_DECREF(addr);
        if (rc < 0) {
            return NULL;
        }
    }
#else
    (void)items;
    (void)token;
#endif
    Py_RETURN_NONE;
}

static PyObject *
tcc_watch_token(PyObject *module, PyObject *arg)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (tcc_watched != NULL && PyDict_CheckExact(arg)) {
        PyObject *addr = PyLong_FromVoidPtr(arg);
        if (addr == NULL) {
            return NULL;
        }
        PyObject *token = PyDict_GetItemWithError(tcc_watched, addr);
        Py_DECREF(addr);
        if (token != NULL) {
            return Py_NewRef(token);
        }
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
#else
    (void)arg;
#endif
    Py_RETURN_NONE;
}

static PyObject *
tcc_watch_failures_get(PyObject *module, PyObject *unused)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyLong_FromUnsignedLongLong(tcc_watch_failures);
#else
    return PyLong_FromLong(0);
#endif
}

/* Whether a tcc segment watches ``d`` (a cheap test: the watcher's bit in the
 * dict's version tag, where 3.12 and 3.13 keep it; tcc_watch_token confirms). */
static inline int
tcc_is_watched(PyObject *d)
{
#if PY_VERSION_HEX >= 0x030C0000
    return tcc_watcher >= 0 && ((tcc_dict_tag(d) >> tcc_watcher) & 1);
#else
    (void)d;
    return 0;
#endif
}

/* A pickler's persistent_id that costs one C call per object: None at once,
 * unless the object is an exact list of at least min_items items, an exact dict
 * a segment watches or that holds "__spec__" (a module's namespace), or (when
 * min_bytes > 0) an exact bytes or bytearray of at least min_bytes bytes, which
 * go to the Python callback (tcc.capture._segments._Dump.pid). */

#if PY_VERSION_HEX < 0x030C0000
#include "structmember.h"
#define Py_T_PYSSIZET T_PYSSIZET
#define Py_READONLY READONLY
#endif

typedef struct {
    PyObject_HEAD
    PyObject *callback;
    Py_ssize_t min_items;
    Py_ssize_t min_bytes;
    int watched_dicts;
    vectorcallfunc vectorcall;
} SegmentHook;

static PyObject *
segment_hook_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    SegmentHook *hook = (SegmentHook *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 1 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0)) {
        PyErr_SetString(PyExc_TypeError, "SegmentHook takes one positional argument");
        return NULL;
    }
    PyObject *obj = args[0];
    if (PyList_CheckExact(obj)) {
        if (PyList_GET_SIZE(obj) >= hook->min_items) {
            return PyObject_CallOneArg(hook->callback, obj);
        }
    }
    else if (PyDict_CheckExact(obj)) {
        if (hook->watched_dicts && tcc_is_watched(obj)) {
            return PyObject_CallOneArg(hook->callback, obj);
        }
        /* a module's namespace (globals() held in a local): written by its name */
        static PyObject *spec_key = NULL;
        if (spec_key == NULL) {
            spec_key = PyUnicode_InternFromString("__spec__");
            if (spec_key == NULL) {
                return NULL;
            }
        }
        PyObject *spec = PyDict_GetItemWithError(obj, spec_key);  /* borrowed */
        if (spec != NULL) {
            return PyObject_CallOneArg(hook->callback, obj);
        }
        if (PyErr_Occurred()) {
            return NULL;
        }
    }
    else if (hook->min_bytes > 0) {
        if ((PyBytes_CheckExact(obj) && PyBytes_GET_SIZE(obj) >= hook->min_bytes)
            || (PyByteArray_CheckExact(obj) && PyByteArray_GET_SIZE(obj) >= hook->min_bytes)) {
            return PyObject_CallOneArg(hook->callback, obj);
        }
    }
    Py_RETURN_NONE;
}

static PyObject *
segment_hook_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *callback;
    Py_ssize_t min_items, min_bytes = 0;
    int watched_dicts = 0;
    static char *kwlist[] = {"callback", "min_items", "min_bytes", "watched_dicts", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "On|np:SegmentHook", kwlist, &callback, &min_items,
                                     &min_bytes, &watched_dicts)) {
        return NULL;
    }
    if (!PyCallable_Check(callback)) {
        PyErr_SetString(PyExc_TypeError, "SegmentHook needs a callable");
        return NULL;
    }
    SegmentHook *hook = (SegmentHook *)type->tp_alloc(type, 0);
    if (hook == NULL) {
        return NULL;
    }
    hook->callback = Py_NewRef(callback);
    hook->min_items = min_items < 1 ? 1 : min_items;
    hook->min_bytes = min_bytes < 0 ? 0 : min_bytes;
    hook->watched_dicts = watched_dicts;
    hook->vectorcall = segment_hook_vectorcall;
    return (PyObject *)hook;
}

static int
segment_hook_traverse(PyObject *self, visitproc visit, void *arg)
{
    Py_VISIT(((SegmentHook *)self)->callback);
    Py_VISIT(Py_TYPE(self));
    return 0;
}

static int
segment_hook_clear(PyObject *self)
{
    Py_CLEAR(((SegmentHook *)self)->callback);
    return 0;
}

static void
segment_hook_dealloc(PyObject *self)
{
    PyTypeObject *tp = Py_TYPE(self);
    PyObject_GC_UnTrack(self);
    segment_hook_clear(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMemberDef segment_hook_members[] = {
    {"__vectorcalloffset__", Py_T_PYSSIZET, offsetof(SegmentHook, vectorcall), Py_READONLY, NULL},
    {NULL},
};

static PyType_Slot segment_hook_slots[] = {
    {Py_tp_new, segment_hook_new},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_traverse, segment_hook_traverse},
    {Py_tp_clear, segment_hook_clear},
    {Py_tp_dealloc, segment_hook_dealloc},
    {Py_tp_members, segment_hook_members},
    {Py_tp_doc, "SegmentHook(callback, min_items, min_bytes=0, watched_dicts=False): a\n"
                "pickler's persistent_id that hands only exact lists of at least min_items\n"
                "items, (if min_bytes > 0) exact bytes and bytearrays of at least min_bytes\n"
                "bytes, and (if watched_dicts) exact dicts a segment watches, to callback."},
    {0, NULL},
};

static PyType_Spec segment_hook_spec = {
    .name = "tcc._native.SegmentHook",
    .basicsize = sizeof(SegmentHook),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = segment_hook_slots,
};

/* ------------------------------------------------------------------------ */

static PyMethodDef tcc_methods[] = {
    {"dict_version", tcc_dict_version, METH_O,
     "dict_version(d) -> int\n\n"
     "The version tag of an exact dict (PEP 509): new on every change."},
    {"view_offset", tcc_view_offset, METH_VARARGS,
     "view_offset(view, exporter) -> int | None\n\n"
     "The byte offset of a memoryview's memory in ``exporter``'s simple buffer, or None\n"
     "when it has none or the view's memory is not inside it."},
    {"segment_shared", tcc_segment_shared, METH_VARARGS,
     "segment_shared(list, start, items) -> tuple\n\n"
     "Indices of the exact dicts among items that something besides the list and items\n"
     "also holds (or that the list holds elsewhere than start + i)."},
    {"segment_unchanged", tcc_segment_unchanged, METH_VARARGS,
     "segment_unchanged(list, start, items, versions) -> bool\n\n"
     "Whether list[start:start+len(items)] holds exactly ``items``, each dict among\n"
     "them still at its recorded version and held by nothing but the list and\n"
     "``items`` (versions[i] is None for an immutable item)."},
    {"dict_watch", tcc_dict_watch, METH_VARARGS,
     "dict_watch(items, token) -> bool\n\n"
     "Watch each exact dict among ``items`` (3.12+): any change sets token[0].\n"
     "False (nothing watched) where the interpreter has no dict watchers."},
    {"dict_unwatch", tcc_dict_unwatch, METH_VARARGS,
     "dict_unwatch(items, token) -> None\n\n"
     "Stop watching the dicts among ``items`` that ``token`` watches."},
    {"watch_failures", tcc_watch_failures_get, METH_NOARGS,
     "watch_failures() -> int\n\n"
     "How many dict changes could not be told to their segment (out of memory):\n"
     "a segment recorded before the count last moved may not be reused."},
    {"watch_token", tcc_watch_token, METH_O,
     "watch_token(d) -> bytearray | None\n\n"
     "The token of the segment watching dict ``d``, if any."},
    {"read_frame", tcc_read_frame, METH_VARARGS,
     "read_frame(gen, null) -> (state, offset, slots, exc, func)\n\n"
     "Read the frame of a generator or coroutine without disturbing it."},
    {"check_frame", tcc_check_frame, METH_VARARGS,
     "check_frame(gen, code, state, offset, slots, exc, null, shadowed=None) -> None\n\n"
     "Validate a frame record against a fresh generator; write nothing.\n"
     "shadowed: bytes, a flag per slot: 1 on a cell slot an inlined\n"
     "comprehension cleared at this point (it may hold a plain value), 2 on\n"
     "the stack slot keeping that cell (it must hold a cell)."},
    {"check_kinds", tcc_check_kinds, METH_VARARGS,
     "check_kinds(slots, kinds, null, lasti_max) -> int\n\n"
     "Index of the first slot that lacks a kind it needs (flags in kinds[i],\n"
     "see KIND_*), or -1.  NULL slots and kind 0 are not checked."},
    {"write_frame", tcc_write_frame, METH_VARARGS,
     "write_frame(gen, code, state, offset, slots, exc, null, shadowed=None) -> None\n\n"
     "Validate a frame record, then write it into a fresh generator."},
    {NULL, NULL, 0, NULL},
};

static int
tcc_exec(PyObject *m)
{
    if (PyModule_AddIntConstant(m, "CREATED", TCC_CREATED) < 0 ||
        PyModule_AddIntConstant(m, "SUSPENDED", TCC_SUSPENDED) < 0 ||
        PyModule_AddIntConstant(m, "RUNNING", TCC_RUNNING) < 0 ||
        PyModule_AddIntConstant(m, "FINISHED", TCC_FINISHED) < 0 ||
        PyModule_AddIntConstant(m, "KIND_ITER", TCC_KIND_ITER) < 0 ||
        PyModule_AddIntConstant(m, "KIND_EXC", TCC_KIND_EXC) < 0 ||
        PyModule_AddIntConstant(m, "KIND_EXC_OR_NONE", TCC_KIND_EXC_OR_NONE) < 0 ||
        PyModule_AddIntConstant(m, "KIND_LASTI", TCC_KIND_LASTI) < 0 ||
        PyModule_AddIntConstant(m, "KIND_LIST", TCC_KIND_LIST) < 0 ||
        PyModule_AddIntConstant(m, "KIND_SET", TCC_KIND_SET) < 0 ||
        PyModule_AddIntConstant(m, "KIND_DICT", TCC_KIND_DICT) < 0 ||
        PyModule_AddIntConstant(m, "KIND_TUPLE", TCC_KIND_TUPLE) < 0 ||
        PyModule_AddIntConstant(m, "KIND_EXC_ITEMS", TCC_KIND_EXC_ITEMS) < 0) {
        return -1;
    }
    PyObject *hook_type = PyType_FromModuleAndSpec(m, &segment_hook_spec, NULL);
    if (hook_type == NULL) {
        return -1;
    }
    if (PyModule_AddObjectRef(m, "SegmentHook", hook_type) < 0) {
        Py_DECREF(hook_type);
        return -1;
    }
    Py_DECREF(hook_type);
    /* The interpreter this was compiled for; checked at import so that a
     * module built for 3.12.0 never runs inside 3.12.x with another ABI. */
    return PyModule_AddStringConstant(m, "BUILT_FOR", PY_VERSION);
}

static PyModuleDef_Slot tcc_slots[] = {
    {Py_mod_exec, tcc_exec},
    {0, NULL},
};

static struct PyModuleDef tcc_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tcc._native",
    .m_doc = "Read and write suspended generator/coroutine frames.",
    .m_size = 0,
    .m_methods = tcc_methods,
    .m_slots = tcc_slots,
};

PyMODINIT_FUNC
PyInit__native(void)
{
    return PyModuleDef_Init(&tcc_module);
}
