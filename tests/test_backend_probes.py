"""Every hardware probe's and build spec's decisions, under a controlled PATH.

The vendor tools are small shell scripts written into tmp_path; each backend gets an env
mapping whose PATH holds only them, so nothing on the host (a real nvcc, say) leaks in.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
from strata_cuda import CudaBackend, cuda_architectures, parse_gpus, parse_release, visible_gpus
from strata_hip import HipBackend, parse_amd_smi, parse_rocminfo, parse_version
from strata_metal import MetalBackend
from strata_sycl import SyclBackend, compiler_version, parse_sycl_ls

from strata_core.backends.cpu import cpu_cmake_args
from strata_core.ops.backend_spec import Backend, ProbeStatus
from strata_core.ops.build import BuildError
from strata_core.ops.config import EngineConfig
from strata_core.ops.hookspecs import hookimpl
from strata_core.ops.plugins import BackendError, Registry, select_backend


def fake(bindir: Path, name: str, out: str = "", rc: int = 0, **by_arg: str) -> Path:
    """An executable ``name`` printing ``by_arg[<its arguments>]`` (a glob) or else ``out``."""
    cases = [
        f"  {arg}) printf '%s\\n' {shlex.quote(text)}; exit {rc};;" for arg, text in by_arg.items()
    ]
    script = "\n".join(
        [
            "#!/bin/sh",
            'case "$*" in',
            *cases,
            f"  *) printf '%s\\n' {shlex.quote(out)}; exit {rc};;",
            "esac",
        ]
    )
    path = bindir / name
    path.write_text(script + "\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def bindir(tmp_path: Path) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    return d


@pytest.fixture
def env(bindir: Path) -> dict[str, str]:
    return {"PATH": str(bindir)}


def cmake_value(args: tuple[str, ...], key: str) -> str | None:
    values = [a.split("=", 1)[1] for a in args if a.startswith(f"-D{key}=")]
    assert len(values) <= 1, f"{key} given twice: {values}"
    return values[0] if values else None


# ---- cpu ----------------------------------------------------------------------------

X86_BASE = {"avx", "avx2", "fma", "f16c"}


def test_cpu_avx512_only_with_avx512f() -> None:
    assert cmake_value(cpu_cmake_args(X86_BASE, "x86_64"), "GGML_AVX512") == "OFF"
    assert cmake_value(cpu_cmake_args(X86_BASE | {"avx512bw"}, "x86_64"), "GGML_AVX512") == "OFF"
    assert cmake_value(cpu_cmake_args(X86_BASE | {"avx512f"}, "x86_64"), "GGML_AVX512") == "ON"


def test_cpu_amx_always_off_and_not_native() -> None:
    args = cpu_cmake_args(X86_BASE | {"avx512f", "amx_tile", "amx_int8", "amx_bf16"}, "x86_64")
    for opt in ("GGML_AMX_TILE", "GGML_AMX_INT8", "GGML_AMX_BF16", "GGML_NATIVE"):
        assert cmake_value(args, opt) == "OFF", opt
    assert cmake_value(args, "GGML_AVX2") == "ON"


def test_cpu_features_follow_flags() -> None:
    args = cpu_cmake_args({"avx"}, "x86_64")
    assert cmake_value(args, "GGML_AVX") == "ON"
    assert cmake_value(args, "GGML_AVX2") == "OFF"
    assert cmake_value(args, "GGML_FMA") == "OFF"


def test_cpu_arm_gets_no_x86_options() -> None:
    args = cpu_cmake_args({"asimd"}, "aarch64")
    assert args == ("-DGGML_NATIVE=OFF", "-DLLAVA_BUILD=ON")


# ---- cuda ---------------------------------------------------------------------------

NVCC_13 = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88"
NVCC_11 = "Cuda compilation tools, release 11.8, V11.8.89"
SMI_ROWS = (
    "0, GPU-aaaa1111, NVIDIA GeForce RTX 3090, 24576, 8.6\n"
    "1, GPU-bbbb2222, NVIDIA H200, 143771, 9.0"
)
SMI_HEADER = "| NVIDIA-SMI 580.82.07   Driver Version: 580.82.07   CUDA Version: 13.0 |"


def cuda(env: dict[str, str], tmp_path: Path) -> CudaBackend:
    return CudaBackend(env, default_home=str(tmp_path / "no-cuda"))


def nvidia_smi(bindir: Path, rows: str = SMI_ROWS, header: str = SMI_HEADER, rc: int = 0) -> None:
    fake(bindir, "nvidia-smi", header, rc=rc, **{"--query-gpu*": rows})


def test_cuda_parsers() -> None:
    assert parse_release(NVCC_13) == (13, 0)
    assert parse_release("garbage") is None
    gpus = parse_gpus(SMI_ROWS + "\n2, GPU-cccc, Tesla, with comma, [N/A], 7.5\n")
    assert [(g.index, g.name, g.memory_mib, g.compute_cap) for g in gpus] == [
        (0, "NVIDIA GeForce RTX 3090", 24576, "8.6"),
        (1, "NVIDIA H200", 143771, "9.0"),
        (2, "Tesla,with comma", None, "7.5"),
    ]


def test_cuda_architectures_numeric_order_no_duplicates() -> None:
    assert cuda_architectures(["9.0", "8.6", "8.6", "12.0", "7.5"]) == "75;86;90;120"
    assert cuda_architectures([]) == ""


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (None, [0, 1]),
        ("1", [1]),
        ("1,0", [1, 0]),
        ("GPU-bbbb", [1]),
        ("0,7,1", [0]),  # CUDA ignores everything after an invalid entry
        ("", []),
        ("-1", []),
        ("MIG-1234", [0, 1]),
    ],
)
def test_cuda_visible_devices(spec: str | None, expected: list[int]) -> None:
    assert [g.index for g in visible_gpus(parse_gpus(SMI_ROWS), spec)] == expected


def test_cuda_no_nvcc_is_toolchain_missing(env, tmp_path) -> None:
    probe = cuda(env, tmp_path).probe()
    assert probe.status is ProbeStatus.TOOLCHAIN_MISSING
    assert probe.reason.startswith("nvcc not found in PATH or ")
    assert str(tmp_path / "no-cuda" / "bin") in probe.reason
    assert ">= 12.0" in probe.reason


def test_cuda_finds_nvcc_in_cuda_home(env, tmp_path) -> None:
    home = tmp_path / "cuda-13"
    (home / "bin").mkdir(parents=True)
    nvcc = fake(home / "bin", "nvcc", NVCC_13)
    probe = cuda({**env, "CUDA_HOME": str(home)}, tmp_path).probe()
    assert probe.toolchain["nvcc"] == str(nvcc)
    assert probe.status is ProbeStatus.NO_DEVICE  # found the toolkit, then no driver


def test_cuda_old_toolkit_is_unsupported(env, bindir, tmp_path) -> None:
    fake(bindir, "nvcc", NVCC_11)
    nvidia_smi(bindir)
    probe = cuda(env, tmp_path).probe()
    assert probe.status is ProbeStatus.DRIVER_UNSUPPORTED
    assert "11.8" in probe.reason and "12.0" in probe.reason


def test_cuda_nvcc_without_driver_is_no_device(env, bindir, tmp_path) -> None:
    fake(bindir, "nvcc", NVCC_13)
    probe = cuda(env, tmp_path).probe()
    assert probe.status is ProbeStatus.NO_DEVICE
    assert "nvidia-smi not found" in probe.reason
    assert probe.toolchain["cuda"] == "13.0"


def test_cuda_failing_nvidia_smi_is_no_device(env, bindir, tmp_path) -> None:
    fake(bindir, "nvcc", NVCC_13)
    nvidia_smi(bindir, rc=9)
    probe = cuda(env, tmp_path).probe()
    assert probe.status is ProbeStatus.NO_DEVICE
    assert "nvidia-smi" in probe.reason and "failed" in probe.reason


def test_cuda_no_gpu_rows_is_no_device(env, bindir, tmp_path) -> None:
    fake(bindir, "nvcc", NVCC_13)
    nvidia_smi(bindir, rows="")
    probe = cuda(env, tmp_path).probe()
    assert probe.status is ProbeStatus.NO_DEVICE
    assert probe.reason == "nvidia-smi lists no GPU"


def test_cuda_visible_devices_hiding_all_says_so(env, bindir, tmp_path) -> None:
    fake(bindir, "nvcc", NVCC_13)
    nvidia_smi(bindir)
    probe = cuda({**env, "CUDA_VISIBLE_DEVICES": ""}, tmp_path).probe()
    assert probe.status is ProbeStatus.NO_DEVICE
    assert "CUDA_VISIBLE_DEVICES=''" in probe.reason and "2 GPU(s)" in probe.reason


def test_cuda_driver_older_than_toolkit(env, bindir, tmp_path) -> None:
    fake(bindir, "nvcc", NVCC_13)
    nvidia_smi(bindir, header=SMI_HEADER.replace("13.0", "12.4"))
    probe = cuda(env, tmp_path).probe()
    assert probe.status is ProbeStatus.DRIVER_UNSUPPORTED
    assert "12.4" in probe.reason and "13.0" in probe.reason
    assert len(probe.devices) == 2


def test_cuda_ok_honours_visible_devices(env, bindir, tmp_path) -> None:
    fake(bindir, "nvcc", NVCC_13)
    nvidia_smi(bindir)
    probe = cuda(env, tmp_path).probe()
    assert probe.status is ProbeStatus.OK, probe.reason
    assert [(d.index, d.name, d.arch) for d in probe.devices] == [
        (0, "NVIDIA GeForce RTX 3090", "8.6"),
        (1, "NVIDIA H200", "9.0"),
    ]
    assert probe.toolchain["driver_cuda"] == "13.0"
    only = cuda({**env, "CUDA_VISIBLE_DEVICES": "1"}, tmp_path).probe()
    assert [d.index for d in only.devices] == [1]


def test_cuda_build_spec_from_visible_gpus(env, bindir, tmp_path) -> None:
    nvcc = fake(bindir, "nvcc", NVCC_13)
    nvidia_smi(bindir)
    spec = cuda(env, tmp_path).build_spec()
    assert cmake_value(spec.cmake_args, "GGML_CUDA") == "ON"
    assert cmake_value(spec.cmake_args, "CMAKE_CUDA_ARCHITECTURES") == "86;90"
    assert cmake_value(spec.cmake_args, "GGML_NATIVE") == "OFF"
    assert cmake_value(spec.cmake_args, "LLAVA_BUILD") == "ON"
    assert spec.env == {"CUDACXX": str(nvcc)}
    assert spec.required_tools == ("cmake", str(nvcc))
    only = cuda({**env, "CUDA_VISIBLE_DEVICES": "1"}, tmp_path).build_spec()
    assert cmake_value(only.cmake_args, "CMAKE_CUDA_ARCHITECTURES") == "90"


def test_cuda_build_spec_without_gpus_uses_documented_fallback(env, bindir, tmp_path) -> None:
    fake(bindir, "nvcc", NVCC_13)
    spec = cuda(env, tmp_path).build_spec()
    archs = cmake_value(spec.cmake_args, "CMAKE_CUDA_ARCHITECTURES")
    assert archs == "75;80;86;89;90"
    doc = Path(__file__).parents[1] / "docs" / "backends" / "cuda.md"
    assert archs in doc.read_text()


def test_cuda_build_spec_override_and_no_native(env, bindir, tmp_path) -> None:
    fake(bindir, "nvcc", NVCC_13)
    nvidia_smi(bindir)
    spec = cuda({**env, "STRATA_CUDA_ARCHITECTURES": "89;120"}, tmp_path).build_spec()
    assert cmake_value(spec.cmake_args, "CMAKE_CUDA_ARCHITECTURES") == "89;120"
    with pytest.raises(BuildError, match="'native' is not a compute capability"):
        cuda({**env, "STRATA_CUDA_ARCHITECTURES": "native"}, tmp_path).build_spec()


def test_cuda_build_spec_without_nvcc_fails_with_probe_reason(env, tmp_path) -> None:
    with pytest.raises(BuildError, match="nvcc not found"):
        cuda(env, tmp_path).build_spec()


def test_cuda_engine_env_and_defaults(tmp_path) -> None:
    backend = cuda({"PATH": ""}, tmp_path)
    assert backend.engine_env(EngineConfig()) == {}
    assert backend.engine_env(EngineConfig(devices="0,2")) == {
        "CUDA_VISIBLE_DEVICES": "0,2",
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    }
    defaults = backend.engine_defaults()
    assert (defaults.n_gpu_layers, defaults.flash_attn) == (-1, True)


# ---- hip ----------------------------------------------------------------------------

ROCMINFO = """\
ROCk module is loaded
=====================
HSA Agents
==========
*******
Agent 1
*******
  Name:                    AMD Ryzen 9 7950X 16-Core Processor
  Marketing Name:          AMD Ryzen 9 7950X 16-Core Processor
  Device Type:             CPU
*******
Agent 2
*******
  Name:                    gfx1100
  Marketing Name:          AMD Radeon RX 7900 XTX
  Device Type:             GPU
  ISA Info:
    ISA 1
      Name:                    amdgcn-amd-amdhsa--gfx1100
*******
Agent 3
*******
  Name:                    gfx90a
  Marketing Name:
  Device Type:             GPU
*** Done ***
"""
AMD_SMI = """\
GPU: 0
    ASIC:
        MARKET_NAME: AMD Instinct MI300X
        TARGET_GRAPHICS_VERSION: gfx942
GPU: 1
    ASIC:
        MARKET_NAME: N/A
        TARGET_GRAPHICS_VERSION: gfx942
"""
HIPCONFIG = {"--version": "6.1.40091-a8dbc0c19", "-l": "/opt/rocm/llvm/bin", "-R": "/opt/rocm"}


def hip(env: dict[str, str], tmp_path: Path) -> HipBackend:
    return HipBackend(env, default_home=str(tmp_path / "no-rocm"))


def test_hip_parsers() -> None:
    assert parse_version("6.1.40091-a8dbc0c19") == (6, 1)
    assert parse_version("") is None
    assert [(d.index, d.name, d.arch) for d in parse_rocminfo(ROCMINFO)] == [
        (0, "AMD Radeon RX 7900 XTX", "gfx1100"),
        (1, "gfx90a", "gfx90a"),
    ]
    assert [(d.index, d.name, d.arch) for d in parse_amd_smi(AMD_SMI)] == [
        (0, "AMD Instinct MI300X", "gfx942"),
        (1, "gfx942", "gfx942"),
    ]


def test_hip_no_hipconfig_is_toolchain_missing(env, tmp_path) -> None:
    probe = hip(env, tmp_path).probe()
    assert probe.status is ProbeStatus.TOOLCHAIN_MISSING
    assert probe.reason.startswith("hipconfig not found in PATH or ")
    assert "ROCm >= 6.1" in probe.reason


def test_hip_finds_hipconfig_in_rocm_path(env, tmp_path) -> None:
    rocm = tmp_path / "rocm-6.2"
    (rocm / "bin").mkdir(parents=True)
    hipconfig = fake(rocm / "bin", "hipconfig", **HIPCONFIG)
    fake(rocm / "bin", "rocminfo", ROCMINFO)
    probe = hip({**env, "ROCM_PATH": str(rocm)}, tmp_path).probe()
    assert probe.status is ProbeStatus.OK, probe.reason
    assert probe.toolchain["hipconfig"] == str(hipconfig)


def test_hip_old_rocm_is_unsupported(env, bindir, tmp_path) -> None:
    fake(bindir, "hipconfig", **{**HIPCONFIG, "--version": "5.7.31921-d1770ee1b"})
    fake(bindir, "rocminfo", ROCMINFO)
    probe = hip(env, tmp_path).probe()
    assert probe.status is ProbeStatus.DRIVER_UNSUPPORTED
    assert "5.7.31921" in probe.reason and "6.1" in probe.reason


def test_hip_falls_back_to_amd_smi(env, bindir, tmp_path) -> None:
    fake(bindir, "hipconfig", **HIPCONFIG)
    fake(bindir, "rocminfo", "Unable to open /dev/kfd read-write", rc=1)
    fake(bindir, "amd-smi", AMD_SMI)
    probe = hip(env, tmp_path).probe()
    assert probe.status is ProbeStatus.OK, probe.reason
    assert [d.arch for d in probe.devices] == ["gfx942", "gfx942"]


def test_hip_no_gpu_is_no_device_naming_each_tool(env, bindir, tmp_path) -> None:
    hipconfig = fake(bindir, "hipconfig", **HIPCONFIG)
    fake(bindir, "rocminfo", "Unable to open /dev/kfd read-write", rc=1)
    probe = hip(env, tmp_path).probe()
    assert probe.status is ProbeStatus.NO_DEVICE
    assert probe.reason.startswith(f"toolchain ok (HIP 6.1.40091-a8dbc0c19, {hipconfig}), no device")
    assert "rocminfo failed" in probe.reason and "amd-smi not found" in probe.reason
    assert "STRATA_HIP_TARGETS" in probe.reason


# What Debian's packages answer (hipcc, libamdhip64-dev 6.4 and clang-21 from sid): HIP
# and ROCm under /usr, clang in LLVM's own directory; rocminfo without the amdgpu driver.
HIPCONFIG_DEBIAN = {"--version": "6.4.43484-9999", "-l": "/usr/lib/llvm-21/bin", "-R": "/usr"}
ROCMINFO_NO_DRIVER = "\x1b[31mROCk module is NOT loaded, possibly no GPU devices\x1b[0m"


def test_hip_debian_layout_builds_for_named_targets(env, bindir, tmp_path) -> None:
    fake(bindir, "hipconfig", **HIPCONFIG_DEBIAN)
    fake(bindir, "rocminfo", ROCMINFO_NO_DRIVER, rc=1)
    backend = hip({**env, "STRATA_HIP_TARGETS": "gfx1100;gfx942"}, tmp_path)
    probe = backend.probe()
    assert probe.status is ProbeStatus.NO_DEVICE
    assert probe.reason.startswith("toolchain ok (HIP 6.4.43484-9999, ")
    spec = backend.build_spec()
    assert cmake_value(spec.cmake_args, "GPU_TARGETS") == "gfx1100;gfx942"
    assert spec.env == {"HIPCXX": "/usr/lib/llvm-21/bin/clang", "HIP_PATH": "/usr"}


@pytest.mark.skipif(
    HipBackend().find("hipconfig") is None, reason="no HIP toolchain on this machine"
)
def test_hip_real_toolchain(tmp_path) -> None:
    """Against the HIP toolchain installed here: the probe finds it, the build spec's
    compiler exists. Only a GPU may be missing (no_device is the honest answer then)."""
    backend = HipBackend({**dict(os.environ), "STRATA_HIP_TARGETS": "gfx1100;gfx942"})
    probe = backend.probe()
    assert probe.status in {ProbeStatus.OK, ProbeStatus.NO_DEVICE}, probe.reason
    if probe.status is ProbeStatus.NO_DEVICE:
        assert probe.reason.startswith("toolchain ok (HIP "), probe.reason
    spec = backend.build_spec()
    assert Path(spec.env["HIPCXX"]).is_file(), spec.env
    assert (Path(spec.env["HIP_PATH"]) / "include" / "hip" / "hip_runtime.h").is_file(), spec.env


def test_hip_build_spec(env, bindir, tmp_path) -> None:
    hipconfig = fake(bindir, "hipconfig", **HIPCONFIG)
    fake(bindir, "rocminfo", ROCMINFO)
    spec = hip(env, tmp_path).build_spec()
    assert cmake_value(spec.cmake_args, "GGML_HIP") == "ON"
    assert cmake_value(spec.cmake_args, "GPU_TARGETS") == "gfx1100;gfx90a"
    assert cmake_value(spec.cmake_args, "AMDGPU_TARGETS") == "gfx1100;gfx90a"
    assert cmake_value(spec.cmake_args, "GGML_NATIVE") == "OFF"
    assert spec.env == {"HIPCXX": "/opt/rocm/llvm/bin/clang", "HIP_PATH": "/opt/rocm"}
    assert spec.required_tools == ("cmake", str(hipconfig))
    override = hip({**env, "STRATA_HIP_TARGETS": "gfx942"}, tmp_path).build_spec()
    assert cmake_value(override.cmake_args, "GPU_TARGETS") == "gfx942"


def test_hip_build_spec_without_targets_fails(env, bindir, tmp_path) -> None:
    fake(bindir, "hipconfig", **HIPCONFIG)
    with pytest.raises(BuildError, match="STRATA_HIP_TARGETS"):
        hip(env, tmp_path).build_spec()
    with pytest.raises(BuildError, match="'native' is not a gfx target"):
        hip({**env, "STRATA_HIP_TARGETS": "native"}, tmp_path).build_spec()


def test_hip_engine_env_and_defaults(tmp_path) -> None:
    backend = hip({"PATH": ""}, tmp_path)
    assert backend.engine_env(EngineConfig()) == {}
    assert backend.engine_env(EngineConfig(devices="1")) == {"HIP_VISIBLE_DEVICES": "1"}
    assert backend.engine_defaults().n_gpu_layers == -1


# ---- sycl ---------------------------------------------------------------------------

SYCL_LS = """\
[opencl:cpu][opencl:0] Intel(R) OpenCL, 13th Gen Intel(R) Core(TM) i7-13700K OpenCL 3.0 (Build 0) [2024.18.6.0.02_160000]
[opencl:gpu][opencl:1] Intel(R) OpenCL Graphics, Intel(R) Arc(TM) A770 Graphics OpenCL 3.0 NEO  [24.09.28717.12]
[level_zero:gpu][level_zero:0] Intel(R) oneAPI Unified Runtime over Level-Zero, Intel(R) Arc(TM) A770 Graphics 12.55.8 [1.3.29735+27]
[level_zero:gpu][level_zero:1] Intel(R) oneAPI Unified Runtime over Level-Zero, Intel(R) UHD Graphics 770 12.2.0 [1.3.29735+27]
"""
SYCL_LS_OLD = "[ext_oneapi_level_zero:gpu:0] Intel(R) Level-Zero, Intel(R) Arc(TM) A770 Graphics 1.3 [1.3.26241]"
ICPX = "Intel(R) oneAPI DPC++/C++ Compiler 2025.0.4 (2025.0.4.20241205)"


def sycl(env: dict[str, str], tmp_path: Path) -> SyclBackend:
    return SyclBackend(env, oneapi_root=str(tmp_path / "no-oneapi"))


def oneapi(bindir: Path) -> None:
    fake(bindir, "icx", ICPX)
    fake(bindir, "icpx", ICPX)


def test_sycl_parsers() -> None:
    assert [(d.index, d.name) for d in parse_sycl_ls(SYCL_LS)] == [
        (0, "Intel(R) Arc(TM) A770 Graphics"),
        (1, "Intel(R) UHD Graphics 770"),
    ]
    assert [(d.index, d.name) for d in parse_sycl_ls(SYCL_LS_OLD)] == [
        (0, "Intel(R) Arc(TM) A770 Graphics")
    ]
    assert compiler_version(ICPX) == "2025.0.4"


def test_sycl_no_compiler_says_install(env, tmp_path) -> None:
    probe = sycl(env, tmp_path).probe()
    assert probe.status is ProbeStatus.TOOLCHAIN_MISSING
    assert probe.reason.startswith("icx and icpx not found on PATH (install the Intel oneAPI")


def test_sycl_installed_but_not_sourced_says_source_setvars(env, bindir, tmp_path) -> None:
    root = tmp_path / "oneapi"
    root.mkdir()
    (root / "setvars.sh").write_text("# oneAPI\n")
    fake(bindir, "icx", ICPX)  # icx alone: the message names only what is missing
    probe = SyclBackend(env, oneapi_root=str(root)).probe()
    assert probe.status is ProbeStatus.TOOLCHAIN_MISSING
    assert probe.reason.startswith("icpx not found on PATH")
    assert f"run `source {root}/setvars.sh` first" in probe.reason


def test_sycl_no_sycl_ls_is_no_device(env, bindir, tmp_path) -> None:
    oneapi(bindir)
    probe = sycl(env, tmp_path).probe()
    assert probe.status is ProbeStatus.NO_DEVICE
    assert "sycl-ls not found" in probe.reason
    assert probe.toolchain["oneapi"] == "2025.0.4"


def test_sycl_no_level_zero_gpu_is_no_device(env, bindir, tmp_path) -> None:
    oneapi(bindir)
    fake(bindir, "sycl-ls", SYCL_LS.splitlines()[0])
    probe = sycl(env, tmp_path).probe()
    assert probe.status is ProbeStatus.NO_DEVICE
    assert "no Level Zero GPU" in probe.reason


def test_sycl_ok(env, bindir, tmp_path) -> None:
    oneapi(bindir)
    fake(bindir, "sycl-ls", SYCL_LS)
    probe = sycl(env, tmp_path).probe()
    assert probe.status is ProbeStatus.OK, probe.reason
    assert [d.index for d in probe.devices] == [0, 1]


def test_sycl_build_spec(env, bindir, tmp_path) -> None:
    oneapi(bindir)
    spec = sycl(env, tmp_path).build_spec()
    assert spec.cmake_args[:3] == (
        "-DGGML_SYCL=ON",
        "-DCMAKE_C_COMPILER=icx",
        "-DCMAKE_CXX_COMPILER=icpx",
    )
    assert cmake_value(spec.cmake_args, "GGML_SYCL_F16") is None
    assert cmake_value(spec.cmake_args, "GGML_NATIVE") == "OFF"
    assert spec.required_tools == ("cmake", "icx", "icpx")
    f16 = sycl({**env, "STRATA_SYCL_F16": "1"}, tmp_path).build_spec()
    assert cmake_value(f16.cmake_args, "GGML_SYCL_F16") == "ON"
    with pytest.raises(BuildError, match="STRATA_SYCL_F16='yes'"):
        sycl({**env, "STRATA_SYCL_F16": "yes"}, tmp_path).build_spec()


def test_sycl_build_spec_without_compiler_fails(env, tmp_path) -> None:
    with pytest.raises(BuildError, match="icx and icpx not found"):
        sycl(env, tmp_path).build_spec()


def test_sycl_engine_env_and_defaults(tmp_path) -> None:
    backend = sycl({"PATH": ""}, tmp_path)
    assert backend.engine_env(EngineConfig()) == {}
    assert backend.engine_env(EngineConfig(devices="0,1")) == {
        "ONEAPI_DEVICE_SELECTOR": "level_zero:0,1"
    }
    assert backend.engine_env(EngineConfig(devices="opencl:1")) == {
        "ONEAPI_DEVICE_SELECTOR": "opencl:1"
    }
    assert backend.engine_defaults().flash_attn is False


# ---- metal --------------------------------------------------------------------------


@pytest.mark.parametrize(("system", "machine"), [("Linux", "x86_64"), ("Darwin", "x86_64")])
def test_metal_needs_apple_silicon(env, system, machine) -> None:
    probe = MetalBackend(env, system, machine).probe()
    assert probe.status is ProbeStatus.UNSUPPORTED_PLATFORM
    assert probe.reason == f"Metal needs macOS on Apple silicon (this is {system} {machine})"
    with pytest.raises(BuildError, match="Metal needs macOS"):
        MetalBackend(env, system, machine).build_spec()


def test_metal_without_xcrun_is_toolchain_missing(env) -> None:
    probe = MetalBackend(env, "Darwin", "arm64").probe()
    assert probe.status is ProbeStatus.TOOLCHAIN_MISSING
    assert probe.reason.startswith("xcrun not found on PATH")


def test_metal_xcrun_stub_without_tools_is_toolchain_missing(env, bindir) -> None:
    fake(bindir, "xcrun", "xcrun: error: invalid active developer path", rc=1)
    probe = MetalBackend(env, "Darwin", "arm64").probe()
    assert probe.status is ProbeStatus.TOOLCHAIN_MISSING
    assert "xcode-select --install" in probe.reason


def test_metal_ok_and_build_spec(env, bindir) -> None:
    fake(bindir, "xcrun", "/Library/Developer/CommandLineTools/SDKs/MacOSX.sdk")
    fake(bindir, "sysctl", "", **{"*brand_string": "Apple M2 Pro", "*memsize": str(32 << 30)})
    backend = MetalBackend(env, "Darwin", "arm64")
    probe = backend.probe()
    assert probe.status is ProbeStatus.OK, probe.reason
    assert (probe.devices[0].name, probe.devices[0].memory_mib) == ("Apple M2 Pro", 32 << 10)
    spec = backend.build_spec()
    assert spec.cmake_args == (
        "-DGGML_METAL=ON",
        "-DGGML_METAL_EMBED_LIBRARY=ON",
        "-DGGML_NATIVE=OFF",
        "-DLLAVA_BUILD=ON",
    )
    assert backend.engine_env(EngineConfig(devices="0")) == {}
    assert backend.engine_defaults().n_gpu_layers == -1


# ---- plugins ------------------------------------------------------------------------


def test_each_plugin_registers_one_backend() -> None:
    import strata_cuda
    import strata_hip
    import strata_metal
    import strata_sycl

    reg = Registry()
    for module in (strata_cuda, strata_hip, strata_sycl, strata_metal):
        reg.register(module, module.__name__, module.__name__.replace("_", "-"), "0.1.0")
    reg.collect()
    assert reg.broken == []
    assert sorted(reg.backends) == ["cuda", "hip", "metal", "sycl"]
    for name, loaded in reg.backends.items():
        assert isinstance(loaded.backend, Backend)
        assert loaded.backend.name == name
        # verified exactly when its doc records a green conformance run on its hardware
        doc = Path(__file__).resolve().parents[1] / "docs" / "backends" / f"{name}.md"
        text = doc.read_text()
        assert loaded.backend.verified_on_hardware == ("conformance green" in text), name
        # build verified when its doc records a build against the real toolchain (or a run)
        verified = loaded.backend.verified_on_hardware or "## Build verified" in text
        assert loaded.backend.build_verified == verified, name


def test_a_backend_with_its_toolchain_but_no_device_builds_but_does_not_run(
    env, bindir, tmp_path
) -> None:
    fake(bindir, "hipconfig", **HIPCONFIG_DEBIAN)
    fake(bindir, "rocminfo", ROCMINFO_NO_DRIVER, rc=1)
    backend = hip(env, tmp_path)

    class Plugin:
        @hookimpl
        def strata_backends(self) -> list[Backend]:
            return [backend]

    reg = Registry()
    reg.register(Plugin(), "hip", "strata-hip", "0.1.0")
    reg.collect()
    with pytest.raises(BackendError, match="backend 'hip' is not available: toolchain ok"):
        select_backend(reg, "hip")  # serving needs a device
    assert select_backend(reg, "hip", for_build=True) is backend  # `strata engine build`
    (bindir / "hipconfig").unlink()
    with pytest.raises(BackendError, match="hipconfig not found"):
        select_backend(reg, "hip", for_build=True)  # no toolchain: nothing to build with


def test_a_built_engine_runs_without_its_toolchain(tmp_path, monkeypatch) -> None:
    """A container image has the engine and no compiler: the backend still serves, with
    its engine given ([engine] llama_cpp) or already built in $STRATA_HOME."""
    import json

    from strata_core.ops.backend_spec import BuildSpec, Probe, ProbeStatus
    from strata_core.ops.build import META, engine_dir

    class NoCompiler(Backend):
        name = "cpu"

        def probe(self) -> Probe:
            return Probe(ProbeStatus.TOOLCHAIN_MISSING, "no C++ compiler on PATH")

        def build_spec(self) -> BuildSpec:
            return BuildSpec(cmake_args=("-DX=1",))

        def engine_env(self, engine):  # type: ignore[no-untyped-def]
            return {}

    class Plugin:
        @hookimpl
        def strata_backends(self) -> list[Backend]:
            return [backend]

    backend = NoCompiler()
    monkeypatch.setenv("STRATA_HOME", str(tmp_path))
    reg = Registry()
    reg.register(Plugin(), "cpu", "strata", "0.1.0")
    reg.collect()
    with pytest.raises(BackendError, match="not available: no C\\+\\+ compiler"):
        select_backend(reg, "cpu")  # nothing built: it would need the compiler
    assert select_backend(reg, "cpu", engine_given=True) is backend
    d = engine_dir("cpu", backend.build_spec())
    (d / "site" / "llama_cpp").mkdir(parents=True)
    (d / META).write_text(json.dumps({"site": str(d / "site")}))
    assert select_backend(reg, "cpu") is backend and select_backend(reg, "auto") is backend
    with pytest.raises(BackendError, match="no C\\+\\+ compiler"):
        select_backend(reg, "cpu", for_build=True)  # building still needs it
