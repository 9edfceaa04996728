"""Plugin manager and backend registry.

Backends arrive through the ``strata.backends`` entry point group. Each entry point is
loaded on its own: one that fails to import is reported as broken, with its
distribution and error, and the others still load. ``STRATA_STRICT_PLUGINS=1`` re-raises
instead, for plugin authors.
"""

from __future__ import annotations

import os
import traceback
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType
from typing import cast

import pluggy

from strata_core.ops import hookspecs
from strata_core.ops.backend_spec import API_VERSION, Backend, ProbeStatus
from strata_core.ops.build import find_engine

ENTRY_POINT_GROUP = "strata.backends"


@dataclass(frozen=True)
class BrokenPlugin:
    name: str
    distribution: str
    version: str
    error: str


@dataclass(frozen=True)
class LoadedBackend:
    backend: Backend
    plugin: str
    distribution: str
    version: str


class BackendError(RuntimeError):
    """A backend was asked for that does not exist or cannot run here."""


class Registry:
    def __init__(self) -> None:
        self.pm = pluggy.PluginManager("strata")
        self.pm.add_hookspecs(hookspecs)
        self.broken: list[BrokenPlugin] = []
        self._origin: dict[str, tuple[str, str]] = {}  # plugin name -> (distribution, version)
        self.backends: dict[str, LoadedBackend] = {}

    def register(self, module: ModuleType | object, name: str, dist: str, version: str) -> None:
        self.pm.register(module, name=name)
        self._origin[name] = (dist, version)

    def load_entry_points(self) -> None:
        strict = os.environ.get("STRATA_STRICT_PLUGINS") == "1"
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = ep.dist.name if ep.dist else "?"
            version = ep.dist.version if ep.dist else "?"
            if self.pm.has_plugin(ep.name):
                continue
            try:
                self.register(ep.load(), ep.name, dist, version)
            except Exception as exc:
                if strict:
                    raise
                error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                self.broken.append(BrokenPlugin(ep.name, dist, version, error))

    def collect(self) -> None:
        self.pm.check_pending()
        for impl in self.pm.hook.strata_backends.get_hookimpls():
            dist, version = self._origin.get(impl.plugin_name, ("?", "?"))
            try:
                found = cast("list[Backend]", impl.function())
                for backend in found:
                    if backend.api_version != API_VERSION:
                        raise BackendError(
                            f"backend {backend.name!r} speaks interface version "
                            f"{backend.api_version}, this Strata speaks {API_VERSION}"
                        )
                    self.backends[backend.name] = LoadedBackend(
                        backend, impl.plugin_name, dist, version
                    )
            except Exception as exc:
                if os.environ.get("STRATA_STRICT_PLUGINS") == "1":
                    raise
                error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                self.broken.append(BrokenPlugin(impl.plugin_name, dist, version, error))

    def get(self, name: str) -> Backend:
        if name not in self.backends:
            known = ", ".join(sorted(self.backends)) or "none"
            hint = ""
            if name in {"cuda", "hip", "sycl", "metal"}:
                hint = f" (install it with: pip install -e '.[{name}]' from the Strata checkout)"
            raise BackendError(f"backend {name!r} is not installed{hint}; installed: {known}")
        return self.backends[name].backend


def load_registry() -> Registry:
    """Load every backend plugin; the built-in CPU backend is always present."""
    from strata_core import __version__
    from strata_core.backends import cpu

    reg = Registry()
    reg.load_entry_points()
    if not reg.pm.has_plugin("cpu"):  # running from a checkout that is not installed
        reg.register(cpu, "cpu", "strata", __version__)
    reg.collect()
    return reg


AUTO_ORDER = ("cuda", "hip", "sycl", "metal", "cpu")


def runnable(backend: Backend, engine_given: bool = False) -> bool:
    """Its probe is ok, or only its toolchain is missing and its engine needs none: given
    (``[engine] llama_cpp``) or already built (a container image has no compiler)."""
    status = backend.probe().status
    if status is not ProbeStatus.TOOLCHAIN_MISSING:
        return status is ProbeStatus.OK
    if engine_given:
        return True
    try:
        return find_engine(backend.name, backend.build_spec()) is not None
    except Exception:  # a build spec may need the missing toolchain (nvcc): nothing found
        return False


def select_backend(reg: Registry, requested: str, for_build: bool = False, engine_given: bool = False) -> Backend:
    """``auto`` takes the first backend that can run (``runnable``); a named one must run.
    With ``for_build`` a named one whose toolchain is there but that sees no device will
    do: an engine can be built on a machine without the GPU (its build spec then needs the
    targets named, e.g. STRATA_HIP_TARGETS)."""
    if requested == "auto":
        for name in AUTO_ORDER:
            if name in reg.backends and runnable(reg.backends[name].backend, engine_given):
                return reg.backends[name].backend
        raise BackendError("no backend can run here (not even cpu); run `strata doctor`")
    backend = reg.get(requested)
    probe = backend.probe()
    if for_build and probe.status is ProbeStatus.NO_DEVICE:
        return backend
    if not for_build and runnable(backend, engine_given):
        return backend
    if not probe.ok:
        others = [
            n for n, lb in sorted(reg.backends.items()) if n != requested and lb.backend.probe().ok
        ]
        raise BackendError(
            f"backend {requested!r} is not available: {probe.reason} "
            f"(or choose one of: {', '.join(others) or 'none'})"
        )
    return backend
