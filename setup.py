"""Build the compiled core. ``KVPOOL_NO_EXTENSIONS=1`` at build time skips it
(the package then runs on its pure-Python twin); a failed build is an error,
never a silent fallback, so a wheel always says what it contains."""

import os

from setuptools import Extension, setup

ext_modules = []
if not os.environ.get("KVPOOL_NO_EXTENSIONS"):
    from Cython.Build import cythonize

    ext_modules = cythonize(
        [
            Extension(
                "kvpool._core",
                ["kvpool/_core.pyx"],
                extra_compile_args=["-O3"],
            ),
            # vLLM's KV-cache manager hot paths, over the core's pool data
            # (cimports kvpool/_core.pxd): one module per concern, sharing
            # the plan's layout (kvpool/_plan.pxd); see kvpool/_manager.pyx.
            *(
                Extension(
                    f"kvpool.{name}",
                    [f"kvpool/{name}.pyx"],
                    depends=["kvpool/_core.pxd", "kvpool/_plan.pxd",
                             "kvpool/_mamba_align.pxd", "kvpool/_caching.pxd"],
                    extra_compile_args=["-O3"],
                )
                for name in ("_plan", "_mamba_align", "_caching", "_allocate", "_lookup",
                             "_manager")
            ),
            # The block hasher: C serialisers, SHA-256 (_sha256.h) and the
            # vendored xxHash header (kvpool/_vendor/xxhash), all compiled in;
            # the module needs no shared library beyond libc.
            Extension(
                "kvpool._hasher",
                ["kvpool/_hasher.pyx"],
                include_dirs=["kvpool"],
                depends=[
                    "kvpool/_hasher_impl.h",
                    "kvpool/_sha256.h",
                    "kvpool/_vendor/xxhash/xxhash.h",
                ],
                extra_compile_args=["-O3"],
            ),
        ],
        compiler_directives={
            "language_level": "3",
            # Index checks are explicit in the code: every array index is
            # validated (or proven in range) before use.
            "boundscheck": False,
            "wraparound": False,
            "initializedcheck": False,
            "cdivision": True,
            "embedsignature": True,
        },
    )

setup(ext_modules=ext_modules)
