/*
 * tcc_compat.h -- one place for every CPython-version difference that the
 * frame reader/writer in tcc_native.c depends on.
 *
 * We compile against the interpreter's own internal headers (the same way
 * greenlet does) instead of copying struct layouts by hand: a hand-copied
 * struct silently goes wrong on a patch release, a real header fails to
 * compile.  Every branch below names the CPython change that made it
 * necessary.
 */
#ifndef TCC_COMPAT_H
#define TCC_COMPAT_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030E0000
#  error "tcc._native supports CPython 3.11, 3.12 and 3.13 only"
#endif

/* The internal headers refuse to be included without this. */
#ifndef Py_BUILD_CORE
#  define Py_BUILD_CORE 1
#endif

#include "opcode.h"              /* YIELD_VALUE, RESUME */
#include "internal/pycore_code.h" /* CO_FAST_CELL, CO_FAST_FREE */
#include "internal/pycore_frame.h"

#define TCC_PY311 (PY_VERSION_HEX < 0x030C0000)
#define TCC_PY313 (PY_VERSION_HEX >= 0x030D0000)

#if TCC_PY313
/* gh-114569 / 3.13: the generator structs left the public cpython/genobject.h
 * and became opaque there; their definition now lives in the internal
 * header. */
#  include "internal/pycore_genobject.h"
#endif

/* ---- the code object of an interpreter frame -------------------------- */
#if TCC_PY313
/* gh-113884 (3.13): `f_code` became `f_executable`, a PyObject that is a code
 * object for every frame we can meet here (generator frames). */
#  define TCC_FRAME_CODE(f) ((PyCodeObject *)(f)->f_executable)
#else
#  define TCC_FRAME_CODE(f) ((f)->f_code)
#endif

/* ---- the function that owns a frame ------------------------------------ */
#if TCC_PY311
/* 3.11 stores the function typed as PyFunctionObject*; 3.12 (gh-99243)
 * renamed it `f_funcobj` and typed it PyObject*. */
#  define TCC_FRAME_FUNC(f) ((PyObject *)(f)->f_func)
#else
#  define TCC_FRAME_FUNC(f) ((f)->f_funcobj)
#endif

/* ---- where a suspended frame stands ------------------------------------ *
 * 3.11/3.12 keep `prev_instr`, which points AT the YIELD_VALUE that
 * suspended the frame.  3.13 (gh-106711 / gh-108866) replaced it with
 * `instr_ptr`, which YIELD_VALUE advances past itself before suspending, so
 * it points at the RESUME that follows.  tcc normalises both to "index of
 * the YIELD_VALUE code unit" so that records read the same on every version.
 */
#if TCC_PY313
#  define TCC_FRAME_INSTR(f) ((f)->instr_ptr)
#  define TCC_SUSPEND_ADJUST 1
#else
#  define TCC_FRAME_INSTR(f) ((f)->prev_instr)
#  define TCC_SUSPEND_ADJUST 0
#endif

/* ---- generator frame states -------------------------------------------- *
 * 3.13 split FRAME_SUSPENDED in two (gh-111058): SUSPENDED and
 * SUSPENDED_YIELD_FROM, chosen by YIELD_VALUE's oparg (0 or 1); gen.send()
 * and gen.throw() use the latter to find the delegate iterator on the stack
 * without decoding bytecode.  Earlier versions decode the RESUME that follows
 * the YIELD_VALUE instead (oparg >= 2 means "inside yield from / await").
 */
#if TCC_PY313
#  define TCC_IS_SUSPENDED(s) \
      ((s) == FRAME_SUSPENDED || (s) == FRAME_SUSPENDED_YIELD_FROM)
#else
#  define TCC_IS_SUSPENDED(s) ((s) == FRAME_SUSPENDED)
#endif

#endif /* TCC_COMPAT_H */
