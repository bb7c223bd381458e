"""Build the optional C extension ``tcc._native``.

The extension reads and writes CPython's internal frame structures, so it is
compiled against the running interpreter's own internal headers.  If the
compiler fails, the install still succeeds and tcc falls back to what it can
do without native support -- unless ``TCC_REQUIRE_NATIVE=1`` is set (CI sets
it), in which case the failure is fatal.
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
            self._fail(exc)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:  # noqa: BLE001
            self._fail(exc)

    def _fail(self, exc: BaseException) -> None:
        if _required():
            raise
        sys.stderr.write(
            "WARNING: tcc._native could not be built (%s).\n"
            "tcc will work without it, recovering runs by journal replay.\n"
            "Set TCC_REQUIRE_NATIVE=1 to make this an error.\n" % (exc,)
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
        )
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
