"""Builds loraplex's native grouped LoRA kernel (engine/worker/csrc/lora_kernel.cpp) against the installed torch.

Run by `make venv` after the install; the shared library lands next to the Python package as
`engine/worker/_lora_kernel*.so`, where `engine.worker.native_ops` imports it. Without it the eager grouped ops
run (the choice is logged at engine start).

`LORAPLEX_KERNEL_ARCH` sets the instruction set (default `native`: the build machine's own, AVX-512 where it
has it); an image built on one machine to run on others should pass a portable one, e.g. `x86-64-v3`.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "engine" / "worker" / "csrc" / "lora_kernel.cpp"


def main() -> int:
    from setuptools import setup
    from torch.utils.cpp_extension import BuildExtension, CppExtension

    arch = os.environ.get("LORAPLEX_KERNEL_ARCH", "native")
    extension = CppExtension(
        "engine.worker._lora_kernel", [str(SOURCE.relative_to(REPO))],
        extra_compile_args=["-O3", f"-march={arch}", "-mprefer-vector-width=512", "-fopenmp", "-fno-math-errno"],
        extra_link_args=["-fopenmp"],
    )
    os.chdir(REPO)
    with tempfile.TemporaryDirectory() as build_temp:
        setup(name="loraplex-lora-kernel", ext_modules=[extension],
              cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
              script_args=["--quiet", "build_ext", "--inplace", "--build-temp", build_temp])
    built = sorted((REPO / "engine" / "worker").glob("_lora_kernel*.so"))
    print(f"built {built[-1].relative_to(REPO)}" if built else "no shared library was built", file=sys.stderr)
    return 0 if built else 1


if __name__ == "__main__":
    sys.exit(main())
