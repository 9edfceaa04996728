"""The CUDA backend: llama.cpp built with nvcc for NVIDIA GPUs."""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from strata_core.backends.cpu import cpu_cmake_args
from strata_core.ops.backend_spec import (
    Backend,
    BuildSpec,
    Device,
    EngineDefaults,
    Probe,
    ProbeStatus,
    SourceEdit,
    cpu_flags,
    run_tool,
    which,
)
from strata_core.ops.build import BuildError
from strata_core.ops.config import EngineConfig
from strata_core.ops.hookspecs import hookimpl

MIN_TOOLKIT = (12, 0)
#: Used when no GPU is visible at build time (a build box, a container build). Every
#: entry also embeds PTX, which the driver JIT-compiles for newer GPUs.
FALLBACK_ARCHITECTURES = "75;80;86;89;90"
GPU_QUERY = "--query-gpu=index,uuid,name,memory.total,compute_cap"

#: ggml-cuda keeps one captured CUDA graph per key, and the key is the graph's first node.
#: llama.cpp builds every decode graph in the same buffer, so a one-row step and a step
#: that verifies a draft window share that node: each change of batch shape threw the
#: other shape's capture away, ran the next step without a graph and captured it again
#: (docs/backends/cuda.md, "Source edits"). Keyed by shape too,
#: each shape keeps its own capture. A key is only a cache slot: ggml-cuda still compares
#: every node before it replays a capture, so a collision costs time, never correctness.
GRAPH_KEY_BY_SHAPE = SourceEdit(
    path="vendor/llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu",
    old="""static const void * ggml_cuda_graph_get_key(ggml_cgraph * cgraph) {
    return cgraph->nodes[0];
}""",
    new="""static const void * ggml_cuda_graph_get_key(ggml_cgraph * cgraph) {
    // Edited by Strata's CUDA backend: graphs of different shapes get different keys.
    const ggml_tensor * first = cgraph->nodes[0];
    const ggml_tensor * last  = cgraph->nodes[cgraph->n_nodes - 1];
    uint64_t key = (uint64_t) (uintptr_t) first;
    const auto mix = [&key](uint64_t v) { key = (key ^ v) * 0x100000001b3ULL; };
    mix((uint64_t) cgraph->n_nodes);
    for (int d = 0; d < GGML_MAX_DIMS; ++d) {
        mix((uint64_t) first->ne[d]);
        mix((uint64_t) last->ne[d]);
    }
    return (const void *) (uintptr_t) key;
}""",
    why="one CUDA graph per batch shape",
)


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_mib: int | None
    compute_cap: str  # "9.0"


def parse_release(text: str) -> tuple[int, int] | None:
    """``nvcc --version`` -> (13, 0) from "Cuda compilation tools, release 13.0, V13.0.88"."""
    m = re.search(r"release (\d+)\.(\d+)", text)
    return (int(m[1]), int(m[2])) if m else None


def parse_gpus(csv: str) -> list[Gpu]:
    """Rows of ``nvidia-smi --query-gpu=index,uuid,name,memory.total,compute_cap``."""
    gpus = []
    for line in csv.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5 or not parts[0].isdigit():
            continue
        memory = int(parts[-2]) if parts[-2].isdigit() else None
        gpus.append(Gpu(int(parts[0]), parts[1], ",".join(parts[2:-2]), memory, parts[-1]))
    return gpus


def visible_gpus(gpus: Sequence[Gpu], spec: str | None) -> list[Gpu]:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` leaves visible (indices or GPU-uuid prefixes)."""
    if spec is None:
        return list(gpus)
    entries = [e.strip() for e in spec.split(",") if e.strip()]
    if any(e.startswith("MIG-") for e in entries):
        return list(gpus)  # MIG instances are not rows of --query-gpu; do not guess
    chosen: list[Gpu] = []
    for entry in entries:
        match = next(
            (g for g in gpus if entry in (str(g.index), g.uuid) or _uuid_prefix(entry, g)), None
        )
        if match is None:
            break  # CUDA ignores every entry after an invalid one
        if match not in chosen:
            chosen.append(match)
    return chosen


def _uuid_prefix(entry: str, gpu: Gpu) -> bool:
    return entry.startswith("GPU-") and gpu.uuid.startswith(entry)


def cuda_architectures(compute_caps: Sequence[str]) -> str:
    """["8.6", "9.0", "8.6", "12.0"] -> "86;90;120" (numeric order, no duplicates)."""
    archs = {cc.replace(".", "") for cc in compute_caps if re.fullmatch(r"\d+\.\d+", cc)}
    return ";".join(sorted(archs, key=int))


class CudaBackend(Backend):
    name = "cuda"
    #: Conformance all green on an H200: bench/results/2026-12-03-cuda-h200-conformance-green.md.
    verified_on_hardware = True
    build_verified = True

    def __init__(
        self, env: Mapping[str, str] | None = None, default_home: str = "/usr/local/cuda"
    ) -> None:
        self._env = env
        self.default_home = default_home

    def find_nvcc(self) -> str | None:
        # CMake's order: the toolkit the operator named, then PATH, then the default install.
        env = self.env
        dirs = [os.path.join(env[v], "bin") for v in ("CUDA_HOME", "CUDA_PATH") if env.get(v)]
        dirs += [env.get("PATH", os.defpath), os.path.join(self.default_home, "bin")]
        return which("nvcc", {"PATH": os.pathsep.join(dirs)})

    def searched(self) -> str:
        named = [f"${v}/bin" for v in ("CUDA_HOME", "CUDA_PATH") if self.env.get(v)]
        return ", ".join([*named, "PATH"]) + f" or {self.default_home}/bin"

    def probe(self) -> Probe:
        nvcc = self.find_nvcc()
        if nvcc is None:
            return Probe(
                ProbeStatus.TOOLCHAIN_MISSING,
                f"nvcc not found in {self.searched()} (install the CUDA toolkit >= 12.0, "
                "or set CUDA_HOME to one)",
            )
        release = parse_release(run_tool([nvcc, "--version"], self.env) or "")
        if release is None:
            return Probe(
                ProbeStatus.TOOLCHAIN_MISSING, f"`{nvcc} --version` failed or named no release"
            )
        toolchain = {"nvcc": nvcc, "cuda": f"{release[0]}.{release[1]}"}
        if release < MIN_TOOLKIT:
            return Probe(
                ProbeStatus.DRIVER_UNSUPPORTED,
                f"CUDA toolkit {toolchain['cuda']} ({nvcc}) is older than 12.0 "
                "(install the CUDA toolkit >= 12.0 and point CUDA_HOME at it)",
                toolchain=toolchain,
            )
        smi = which("nvidia-smi", self.env)
        if smi is None:
            return Probe(
                ProbeStatus.NO_DEVICE,
                f"no NVIDIA driver: nvidia-smi not found on PATH (nvcc {toolchain['cuda']} is "
                "installed, but running needs the NVIDIA driver and a GPU)",
                toolchain=toolchain,
            )
        rows = run_tool([smi, GPU_QUERY, "--format=csv,noheader,nounits"], self.env)
        if rows is None:
            return Probe(
                ProbeStatus.NO_DEVICE,
                f"`nvidia-smi {GPU_QUERY}` failed: the NVIDIA driver is not loaded or is too old",
                toolchain=toolchain,
            )
        every = parse_gpus(rows)
        gpus = visible_gpus(every, self.env.get("CUDA_VISIBLE_DEVICES"))
        if not gpus:
            reason = "nvidia-smi lists no GPU"
            if every:
                reason = (
                    f"CUDA_VISIBLE_DEVICES={self.env.get('CUDA_VISIBLE_DEVICES')!r} hides all "
                    f"{len(every)} GPU(s) nvidia-smi lists"
                )
            return Probe(ProbeStatus.NO_DEVICE, reason, toolchain=toolchain)
        devices = tuple(Device(g.index, g.name, g.memory_mib, g.compute_cap) for g in gpus)
        driver = re.search(r"CUDA Version:\s*(\d+)\.(\d+)", run_tool([smi], self.env) or "")
        if driver:
            toolchain["driver_cuda"] = f"{driver[1]}.{driver[2]}"
            # Minor-version compatibility: a driver runs any toolkit of its major version.
            if int(driver[1]) < release[0]:
                return Probe(
                    ProbeStatus.DRIVER_UNSUPPORTED,
                    f"the NVIDIA driver supports CUDA up to {toolchain['driver_cuda']}, older "
                    f"than nvcc's {toolchain['cuda']} (update the driver, or point CUDA_HOME at "
                    f"a CUDA {driver[1]}.x toolkit)",
                    devices,
                    toolchain,
                )
        reason = f"CUDA {toolchain['cuda']}, {len(devices)} GPU(s) visible"
        return Probe(ProbeStatus.OK, reason, devices, toolchain)

    def build_spec(self) -> BuildSpec:
        nvcc = self.find_nvcc()
        if nvcc is None:
            raise BuildError(self.probe().reason)
        archs = self.env.get("STRATA_CUDA_ARCHITECTURES", "").strip()
        if archs:
            bad = [a for a in archs.split(";") if not re.fullmatch(r"\d+[af]?(-real|-virtual)?", a)]
            if bad:
                raise BuildError(
                    f"STRATA_CUDA_ARCHITECTURES={archs!r}: {bad[0]!r} is not a compute "
                    "capability like 86 or 90 (list them separated by ';', e.g. 86;90)"
                )
        else:
            caps = [d.arch for d in self.probe().devices if d.arch]
            archs = cuda_architectures(caps) or FALLBACK_ARCHITECTURES
        args = ("-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={archs}")
        return BuildSpec(
            cmake_args=args + cpu_cmake_args(cpu_flags(), platform.machine()),
            env={"CUDACXX": nvcc},
            required_tools=("cmake", nvcc),
            source_edits=(GRAPH_KEY_BY_SHAPE,),
        )

    def engine_env(self, engine: EngineConfig) -> dict[str, str]:
        if not engine.devices:
            return {}
        # PCI order makes the indices mean what nvidia-smi and `strata doctor` show.
        return {"CUDA_VISIBLE_DEVICES": engine.devices, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}

    def engine_defaults(self) -> EngineDefaults:
        return EngineDefaults(n_gpu_layers=-1, flash_attn=True)


@hookimpl
def strata_backends() -> list[Backend]:
    return [CudaBackend()]
