"""Build the optional C extensions ``tcc._native`` and ``tcc.store._fast``.

``tcc._native`` reads and writes CPython's internal frame structures, so it is
compiled against the running interpreter's own internal headers.
``tcc.store._fast`` holds byte helpers for the store's commit path and uses
the public C API only.  If the compiler fails, the install still succeeds and
tcc falls back to what it can do without them -- unless
``TCC_REQUIRE_NATIVE=1`` is set (CI sets it), in which case the failure is
fatal.
"""

import os
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def _required() -> bool:
    return os.environ.get("TCC_REQUIRE_NATIVE", "") not in ("", "0")


class OptionalBuildExt(build_ext):
    def run(self) -> None:
        try:
            super().run()
        except Exception as exc:  # noqa: BLE001 - any compiler failure
            self._fail("the C extensions", exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self._fail(ext.name, exc)

    def _fail(self, what: str, exc: BaseException) -> None:
        if _required():
            raise
        fallback = {
            "tcc._native": "recovering runs by journal replay",
            "tcc.store._fast": "with slower pure-Python store helpers",
        }.get(what, "with reduced function")
        sys.stderr.write(
            "WARNING: %s could not be built (%s).\n"
            "tcc will work without it, %s.\n"
            "Set TCC_REQUIRE_NATIVE=1 to make this an error.\n" % (what, exc, fallback)
        )


cflags = ["-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
          "-Wno-missing-field-initializers"]
if os.environ.get("TCC_NATIVE_DEBUG"):
    cflags += ["-UNDEBUG", "-O0", "-g"]

setup(
    ext_modules=[
        Extension(
            "tcc._native",
            sources=["native/tcc_native.c"],
            depends=["native/tcc_compat.h"],
            include_dirs=["native", sysconfig.get_paths()["include"]],
            extra_compile_args=cflags,
        ),
        Extension(
            "tcc.store._fast",
            sources=["native/tcc_store.c"],
            extra_compile_args=cflags,
        ),
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
