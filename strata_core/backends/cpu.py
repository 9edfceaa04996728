"""The built-in CPU backend, registered like any other plugin."""

from __future__ import annotations

import platform
import sys
from collections.abc import Set

from strata_core.ops.backend_spec import (
    Backend,
    BuildSpec,
    Device,
    Probe,
    ProbeStatus,
    cpu_flags,
    which,
)
from strata_core.ops.config import EngineConfig
from strata_core.ops.hookspecs import hookimpl

X86_FEATURES = {"avx": "GGML_AVX", "avx2": "GGML_AVX2", "fma": "GGML_FMA", "f16c": "GGML_F16C"}


def cpu_cmake_args(flags: Set[str], machine: str) -> tuple[str, ...]:
    # A native build enables AMX on some Xeons and crashes in ggml_backend_amx_mul_mat,
    # so the instruction sets are named one by one and AMX is always off.
    args = ["-DGGML_NATIVE=OFF", "-DLLAVA_BUILD=ON"]
    if machine in {"x86_64", "amd64", "AMD64"}:
        for flag, opt in X86_FEATURES.items():
            args.append(f"-D{opt}={'ON' if flag in flags else 'OFF'}")
        args.append(f"-DGGML_AVX512={'ON' if 'avx512f' in flags else 'OFF'}")
        args += ["-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"]
    return tuple(args)


class CpuBackend(Backend):
    name = "cpu"
    verified_on_hardware = True
    build_verified = True

    def probe(self) -> Probe:
        compiler = which("c++") or which("g++") or which("clang++")
        toolchain = {"python": sys.version.split()[0], "machine": platform.machine()}
        devices = (Device(0, platform.processor() or platform.machine()),)
        if compiler is None:
            return Probe(
                ProbeStatus.TOOLCHAIN_MISSING,
                "no C++ compiler on PATH (install g++ or clang++ to build the CPU engine)",
                devices,
                toolchain,
            )
        toolchain["c++"] = compiler
        return Probe(ProbeStatus.OK, "C++ compiler found", devices, toolchain)

    def build_spec(self) -> BuildSpec:
        return BuildSpec(cmake_args=cpu_cmake_args(cpu_flags(), platform.machine()))

    def engine_env(self, engine: EngineConfig) -> dict[str, str]:
        return {}


@hookimpl
def strata_backends() -> list[Backend]:
    return [CpuBackend()]
