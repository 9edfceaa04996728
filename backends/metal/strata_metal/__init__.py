"""The Metal backend: llama.cpp on the GPU of Apple silicon Macs."""

from __future__ import annotations

import platform
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


class MetalBackend(Backend):
    name = "metal"

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        system: str | None = None,
        machine: str | None = None,
    ) -> None:
        self._env = env
        self.system = system or platform.system()
        self.machine = machine or platform.machine()

    def unavailable(self) -> Probe | None:
        """Why Metal cannot be built here, or None."""
        if (self.system, self.machine) != ("Darwin", "arm64"):
            return Probe(
                ProbeStatus.UNSUPPORTED_PLATFORM,
                f"Metal needs macOS on Apple silicon (this is {self.system} {self.machine})",
            )
        xcrun = which("xcrun", self.env)
        if xcrun is None:
            return Probe(
                ProbeStatus.TOOLCHAIN_MISSING,
                "xcrun not found on PATH (install the Xcode command line tools: "
                "`xcode-select --install`)",
            )
        # /usr/bin/xcrun is a stub on every Mac; it fails until the tools are installed.
        if run_tool([xcrun, "--show-sdk-path"], self.env) is None:
            return Probe(
                ProbeStatus.TOOLCHAIN_MISSING,
                "`xcrun --show-sdk-path` failed: the Xcode command line tools are not installed "
                "or not selected (run `xcode-select --install`)",
            )
        return None

    def probe(self) -> Probe:
        failed = self.unavailable()
        if failed:
            return failed
        chip = (run_tool(["sysctl", "-n", "machdep.cpu.brand_string"], self.env) or "").strip()
        memory = (run_tool(["sysctl", "-n", "hw.memsize"], self.env) or "").strip()
        memory_mib = int(memory) // (1 << 20) if memory.isdigit() else None  # unified memory
        device = Device(0, chip or "Apple silicon GPU", memory_mib)
        toolchain = {"xcrun": which("xcrun", self.env) or "xcrun", "macos": platform.mac_ver()[0]}
        return Probe(ProbeStatus.OK, f"Metal on {device.name}", (device,), toolchain)

    def build_spec(self) -> BuildSpec:
        failed = self.unavailable()
        if failed:
            raise BuildError(failed.reason)
        args = ("-DGGML_METAL=ON", "-DGGML_METAL_EMBED_LIBRARY=ON")
        return BuildSpec(
            cmake_args=args + cpu_cmake_args(cpu_flags(), self.machine),
            required_tools=("cmake", "xcrun"),
        )

    def engine_env(self, engine: EngineConfig) -> dict[str, str]:
        return {}  # one GPU per Mac: nothing to select

    def engine_defaults(self) -> EngineDefaults:
        return EngineDefaults(n_gpu_layers=-1, flash_attn=True)


@hookimpl
def strata_backends() -> list[Backend]:
    return [MetalBackend()]
