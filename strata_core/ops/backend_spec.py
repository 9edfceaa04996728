"""The interface every hardware backend implements, and helpers for writing probes.

A backend describes how to build llama.cpp for its hardware and how to point the engine
at its devices. It never loads native code: probing shells out to the vendor's tools,
each with a timeout, so listing backends is safe on any machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from strata_core.ops.config import EngineConfig

#: Bumped when the Backend interface changes incompatibly.
API_VERSION = 1

PROBE_TIMEOUT_S = 10.0


class ProbeStatus(str, Enum):
    OK = "ok"
    TOOLCHAIN_MISSING = "toolchain_missing"
    NO_DEVICE = "no_device"
    DRIVER_UNSUPPORTED = "driver_unsupported"
    UNSUPPORTED_PLATFORM = "unsupported_platform"


@dataclass(frozen=True)
class Device:
    index: int
    name: str
    memory_mib: int | None = None
    arch: str | None = None  # compute capability, gfx target, ...


@dataclass(frozen=True)
class Probe:
    status: ProbeStatus
    reason: str
    devices: tuple[Device, ...] = ()
    toolchain: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status is ProbeStatus.OK


@dataclass(frozen=True)
class SourceEdit:
    """One change a backend makes to the pinned llama.cpp source before it builds.

    ``path`` is relative to the llama-cpp-python source tree; ``old`` must occur in that
    file exactly once as released, and is replaced by ``new``. Edits are applied to the
    released text every time (the original is kept beside the file), so changing an edit
    and rebuilding never stacks it on an older one. The source tree is shared by every
    backend and an edit stays in it after its build, so it must be harmless to any other
    backend that compiles the same file (the HIP backend compiles ggml-cuda's sources).
    """

    path: str
    old: str
    new: str
    why: str


@dataclass(frozen=True)
class BuildSpec:
    """How to build llama-cpp-python for a backend.

    ``cmake_args``, ``env`` and ``source_edits`` are part of the build's cache key;
    ``required_tools`` are checked on PATH before a build starts.
    """

    cmake_args: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    required_tools: tuple[str, ...] = ("cmake",)
    source_edits: tuple[SourceEdit, ...] = ()


@dataclass(frozen=True)
class EngineDefaults:
    n_gpu_layers: int = 0
    flash_attn: bool = False


class Backend(ABC):
    """One accelerator family. Subclasses set ``name`` and implement the four methods."""

    name: ClassVar[str]
    api_version: ClassVar[int] = API_VERSION
    #: True once a conformance run on real hardware is recorded in docs/backends/<name>.md.
    verified_on_hardware: ClassVar[bool] = False
    #: True once ``strata engine build`` for this backend has succeeded against its real
    #: toolchain and docs/backends/<name>.md records how (a build proves the recipe, not
    #: that the engine runs: that is ``verified_on_hardware``).
    build_verified: ClassVar[bool] = False
    #: Conformance tests this backend is known to fail: test name -> why. The kit marks
    #: them as expected failures (strict), so they are reported, never skipped.
    expected_failures: ClassVar[Mapping[str, str]] = {}
    #: The environment probes read; None means os.environ at call time (tests inject one).
    _env: Mapping[str, str] | None = None

    @property
    def env(self) -> Mapping[str, str]:
        return os.environ if self._env is None else self._env

    @abstractmethod
    def probe(self) -> Probe:
        """Find the toolchain and devices; never raises, never loads native code."""

    @abstractmethod
    def build_spec(self) -> BuildSpec:
        """CMake arguments, environment and tools for building llama.cpp here."""

    @abstractmethod
    def engine_env(self, engine: EngineConfig) -> dict[str, str]:
        """Environment variables that select the devices the engine may use."""

    def engine_defaults(self) -> EngineDefaults:
        return EngineDefaults()


# ---- helpers for probes -------------------------------------------------------------


def which(tool: str, env: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    return shutil.which(tool, path=env.get("PATH"))


def run_tool(
    args: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = PROBE_TIMEOUT_S
) -> str | None:
    """Run a probe command; its stdout, or None if it is missing, fails or hangs."""
    try:
        done = subprocess.run(
            list(args),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(os.environ if env is None else env),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def cpu_flags() -> set[str]:
    """The CPU feature flags from /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()
