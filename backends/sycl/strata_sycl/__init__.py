"""The SYCL backend: llama.cpp built with Intel oneAPI (icx/icpx) for Intel GPUs."""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping

from strata_core.backends.cpu import cpu_cmake_args
from strata_core.ops.backend_spec import (
    Backend,
    BuildSpec,
    Device,
    EngineDefaults,
    Probe,
    ProbeStatus,
    cpu_flags,
    run_tool,
    which,
)
from strata_core.ops.build import BuildError
from strata_core.ops.config import EngineConfig
from strata_core.ops.hookspecs import hookimpl

COMPILERS = ("icx", "icpx")
# "[level_zero:gpu][level_zero:0] <platform>, <device> <version> [<driver>]" (oneAPI 2024+)
# "[ext_oneapi_level_zero:gpu:0] <platform>, <device> <version> [<driver>]" (older)
LEVEL_ZERO_GPU = re.compile(
    r"^\[(?:ext_oneapi_)?level_zero:gpu(?::(\d+))?\](?:\[level_zero:(\d+)\])?\s+(.*)$"
)


def parse_sycl_ls(text: str) -> list[Device]:
    """The Level Zero GPUs ``sycl-ls`` lists (llama.cpp's SYCL backend runs on those)."""
    devices: list[Device] = []
    for line in text.splitlines():
        m = LEVEL_ZERO_GPU.match(line.strip())
        if m is None:
            continue
        index = int(m[1] or m[2] or len(devices))
        described = m[3].split(", ", 1)[-1]
        name = re.sub(r"\s+\S+\s+\[[^\]]*\]\s*$", "", described)
        devices.append(Device(index, name))
    return devices


def compiler_version(text: str) -> str | None:
    """``icpx --version`` -> "2025.0.4" from "Intel(R) oneAPI DPC++/C++ Compiler 2025.0.4 (...)"."""
    m = re.search(r"Compiler (\d+\.\d+(?:\.\d+)?)", text)
    return m[1] if m else None


class SyclBackend(Backend):
    name = "sycl"

    def __init__(
        self, env: Mapping[str, str] | None = None, oneapi_root: str = "/opt/intel/oneapi"
    ) -> None:
        self._env = env
        self.oneapi_root = oneapi_root

    def missing_toolchain(self) -> str | None:
        """Why icx/icpx cannot be used, or None when both are on PATH."""
        missing = [c for c in COMPILERS if which(c, self.env) is None]
        if not missing:
            return None
        root = self.env.get("ONEAPI_ROOT") or self.oneapi_root
        setvars = os.path.join(root, "setvars.sh")
        if os.path.isfile(setvars):
            return (
                f"{' and '.join(missing)} not found on PATH, but oneAPI is installed in {root}: "
                f"run `source {setvars}` first"
            )
        return (
            f"{' and '.join(missing)} not found on PATH (install the Intel oneAPI Base Toolkit, "
            f"then run `source {setvars}`)"
        )

    def probe(self) -> Probe:
        missing = self.missing_toolchain()
        if missing:
            return Probe(ProbeStatus.TOOLCHAIN_MISSING, missing)
        icpx = which("icpx", self.env) or "icpx"
        version = compiler_version(run_tool([icpx, "--version"], self.env) or "")
        toolchain = {"icpx": icpx, "oneapi": version or "unknown"}
        sycl_ls = which("sycl-ls", self.env)
        if sycl_ls is None:
            return Probe(
                ProbeStatus.NO_DEVICE,
                "sycl-ls not found on PATH (it ships with the oneAPI compiler; is setvars.sh "
                "sourced?)",
                toolchain=toolchain,
            )
        out = run_tool([sycl_ls], self.env)
        if out is None:
            return Probe(
                ProbeStatus.NO_DEVICE,
                "sycl-ls failed (install the Intel GPU driver and compute runtime)",
                toolchain=toolchain,
            )
        devices = tuple(parse_sycl_ls(out))
        if not devices:
            return Probe(
                ProbeStatus.NO_DEVICE,
                "sycl-ls lists no Level Zero GPU (install the Intel GPU driver and the Level "
                "Zero compute runtime; check ONEAPI_DEVICE_SELECTOR)",
                toolchain=toolchain,
            )
        reason = f"oneAPI {toolchain['oneapi']}, {len(devices)} Level Zero GPU(s)"
        return Probe(ProbeStatus.OK, reason, devices, toolchain)

    def build_spec(self) -> BuildSpec:
        missing = self.missing_toolchain()
        if missing:
            raise BuildError(missing)
        f16 = self.env.get("STRATA_SYCL_F16", "0").strip() or "0"
        if f16 not in {"0", "1"}:
            raise BuildError(f"STRATA_SYCL_F16={f16!r}: expected 1 (half precision) or 0")
        args = ["-DGGML_SYCL=ON", "-DCMAKE_C_COMPILER=icx", "-DCMAKE_CXX_COMPILER=icpx"]
        if f16 == "1":
            args.append("-DGGML_SYCL_F16=ON")
        return BuildSpec(
            cmake_args=(*args, *cpu_cmake_args(cpu_flags(), platform.machine())),
            required_tools=("cmake", *COMPILERS),
        )

    def engine_env(self, engine: EngineConfig) -> dict[str, str]:
        if not engine.devices:
            return {}
        # "0,1" means Level Zero GPUs 0 and 1; a full selector ("opencl:0") is passed as is.
        selector = engine.devices if ":" in engine.devices else f"level_zero:{engine.devices}"
        return {"ONEAPI_DEVICE_SELECTOR": selector}

    def engine_defaults(self) -> EngineDefaults:
        # Flash attention on SYCL is recent and has given wrong output on some Intel GPUs.
        return EngineDefaults(n_gpu_layers=-1, flash_attn=False)


@hookimpl
def strata_backends() -> list[Backend]:
    return [SyclBackend()]
