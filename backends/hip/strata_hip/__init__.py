"""The HIP backend: llama.cpp built with ROCm's clang for AMD GPUs."""

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

MIN_ROCM = (6, 1)
GFX = re.compile(r"gfx[0-9a-f]+")


def parse_version(text: str) -> tuple[int, int] | None:
    """``hipconfig --version`` -> (6, 1) from "6.1.40091-a8dbc0c19"."""
    m = re.match(r"\s*(\d+)\.(\d+)", text)
    return (int(m[1]), int(m[2])) if m else None


def parse_rocminfo(text: str) -> list[Device]:
    """GPU agents of ``rocminfo``: an agent whose ``Name:`` is a bare gfx target."""
    devices: list[Device] = []
    for agent in re.split(r"\n\*+\s*\nAgent \d+\s*\n\*+", text)[1:]:
        name = re.search(r"^\s*Name:\s*(gfx[0-9a-f]+)\s*$", agent, re.M)
        if name is None:
            continue  # a CPU agent
        market = re.search(r"^\s*Marketing Name:[ \t]*(\S.*?)\s*$", agent, re.M)
        devices.append(Device(len(devices), market[1] if market else name[1], None, name[1]))
    return devices


def parse_amd_smi(text: str) -> list[Device]:
    """``amd-smi static --asic``: blocks "GPU: N" with MARKET_NAME and TARGET_GRAPHICS_VERSION."""
    devices = []
    for block in re.split(r"^(?=GPU: \d+)", text, flags=re.M):
        index = re.match(r"GPU: (\d+)", block)
        target = re.search(r"TARGET_GRAPHICS_VERSION:\s*(gfx[0-9a-f]+)", block)
        if index and target:
            market = re.search(r"MARKET_NAME:[ \t]*(\S.*?)\s*$", block, re.M)
            name = market[1] if market and market[1] != "N/A" else target[1]
            devices.append(Device(int(index[1]), name, None, target[1]))
    return devices


class HipBackend(Backend):
    name = "hip"
    #: Built against Debian's HIP 6.4 toolchain for gfx1100;gfx942 (docs/backends/hip.md).
    build_verified = True

    def __init__(
        self, env: Mapping[str, str] | None = None, default_home: str = "/opt/rocm"
    ) -> None:
        self._env = env
        self.default_home = default_home

    def find(self, tool: str) -> str | None:
        """A ROCm tool from $ROCM_PATH/bin, PATH or the default install, in that order."""
        dirs = [os.path.join(self.env["ROCM_PATH"], "bin")] if self.env.get("ROCM_PATH") else []
        dirs += [self.env.get("PATH", os.defpath), os.path.join(self.default_home, "bin")]
        return which(tool, {"PATH": os.pathsep.join(dirs)})

    def searched(self) -> str:
        named = ["$ROCM_PATH/bin"] if self.env.get("ROCM_PATH") else []
        return ", ".join([*named, "PATH"]) + f" or {self.default_home}/bin"

    def find_gpus(self) -> tuple[list[Device], list[str]]:
        """GPUs from rocminfo, else amd-smi; and what each tool said when it found none."""
        said: list[str] = []
        for tool, args, parse in (
            ("rocminfo", [], parse_rocminfo),
            ("amd-smi", ["static", "--asic"], parse_amd_smi),
        ):
            path = self.find(tool)
            out = run_tool([path, *args], self.env) if path else None
            devices = parse(out) if out else []
            if devices:
                return devices, said
            status = "not found" if not path else "failed" if out is None else "lists no GPU"
            said.append(f"{tool} {status}")
        return [], said

    def probe(self) -> Probe:
        hipconfig = self.find("hipconfig")
        if hipconfig is None:
            return Probe(
                ProbeStatus.TOOLCHAIN_MISSING,
                f"hipconfig not found in {self.searched()} (install ROCm >= 6.1, or set "
                "ROCM_PATH to it)",
            )
        out = run_tool([hipconfig, "--version"], self.env) or ""
        version = parse_version(out)
        if version is None:
            return Probe(ProbeStatus.TOOLCHAIN_MISSING, f"`{hipconfig} --version` failed")
        toolchain = {"hipconfig": hipconfig, "hip": out.strip()}
        if version < MIN_ROCM:
            return Probe(
                ProbeStatus.DRIVER_UNSUPPORTED,
                f"ROCm/HIP {out.strip()} ({hipconfig}) is older than 6.1 (install ROCm >= 6.1)",
                toolchain=toolchain,
            )
        devices, said = self.find_gpus()
        if not devices:
            # The toolchain alone builds engines (for STRATA_HIP_TARGETS), so say it is there.
            return Probe(
                ProbeStatus.NO_DEVICE,
                f"toolchain ok (HIP {out.strip()}, {hipconfig}), no device: no AMD GPU found: "
                f"{'; '.join(said)} (check that the amdgpu driver is loaded and that you are "
                "in the render and video groups; `strata engine build --backend hip` still "
                "builds for the targets in STRATA_HIP_TARGETS)",
                toolchain=toolchain,
            )
        targets = ", ".join(sorted({d.arch or "" for d in devices}))
        reason = f"ROCm {version[0]}.{version[1]}, {len(devices)} GPU(s) ({targets})"
        return Probe(ProbeStatus.OK, reason, tuple(devices), toolchain)

    def build_spec(self) -> BuildSpec:
        hipconfig = self.find("hipconfig")
        if hipconfig is None:
            raise BuildError(self.probe().reason)
        targets = self.env.get("STRATA_HIP_TARGETS", "").strip()
        said: list[str] = []
        if targets:
            bad = [t for t in targets.split(";") if not GFX.match(t)]
            if bad:
                raise BuildError(
                    f"STRATA_HIP_TARGETS={targets!r}: {bad[0]!r} is not a gfx target "
                    "(list them separated by ';', e.g. gfx1100;gfx90a)"
                )
        else:
            devices, said = self.find_gpus()
            targets = ";".join(sorted({d.arch for d in devices if d.arch}))
        if not targets:
            # gfx code runs only on the target it was built for, so no fallback list helps.
            raise BuildError(
                f"no AMD GPU target to build for ({'; '.join(said)}); set STRATA_HIP_TARGETS, "
                "e.g. STRATA_HIP_TARGETS=gfx1100"
            )
        clang_dir = (run_tool([hipconfig, "-l"], self.env) or "").strip()
        rocm = (run_tool([hipconfig, "-R"], self.env) or "").strip()
        if not clang_dir or not rocm:
            raise BuildError(f"`{hipconfig} -l` / `{hipconfig} -R` failed; is ROCm complete?")
        args = ("-DGGML_HIP=ON", f"-DGPU_TARGETS={targets}", f"-DAMDGPU_TARGETS={targets}")
        return BuildSpec(
            cmake_args=args + cpu_cmake_args(cpu_flags(), platform.machine()),
            env={"HIPCXX": f"{clang_dir}/clang", "HIP_PATH": rocm},
            required_tools=("cmake", hipconfig),
        )

    def engine_env(self, engine: EngineConfig) -> dict[str, str]:
        if not engine.devices:
            return {}
        # Not ROCR_VISIBLE_DEVICES too: HIP indexes into what ROCr leaves, so "1" in both hides all.
        return {"HIP_VISIBLE_DEVICES": engine.devices}

    def engine_defaults(self) -> EngineDefaults:
        return EngineDefaults(n_gpu_layers=-1, flash_attn=True)


@hookimpl
def strata_backends() -> list[Backend]:
    return [HipBackend()]
