"""Builds and caches a backend's native engine: llama-cpp-python compiled from its
pinned source release with the backend's build spec.

Each build lives in ``$STRATA_HOME/engines/<backend>-<version>-<key>/`` where the key
hashes the CMake arguments and environment, so builds for different backends (or
flags) sit side by side and a CPU build is never mistaken for a CUDA one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata_core.ops.backend_spec import Backend, BuildSpec, SourceEdit

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
META = "build.json"

Log = Callable[[str], None]


class BuildError(RuntimeError):
    pass


def strata_home() -> Path:
    return Path(os.environ.get("STRATA_HOME") or Path.home() / ".cache" / "strata")


@dataclass(frozen=True)
class EngineBuild:
    backend: str
    path: Path  # the directory that holds the ``llama_cpp`` package
    meta: dict[str, Any]


def build_key(spec: BuildSpec) -> str:
    ident: dict[str, object] = {
        "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION,
        "machine": platform.machine(),
        "cmake_args": list(spec.cmake_args),
        "env": dict(sorted(spec.env.items())),
    }
    if spec.source_edits:  # absent from older keys, so builds without edits keep theirs
        ident["source_edits"] = [[e.path, e.old, e.new] for e in spec.source_edits]
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:12]


def engine_dir(backend: str, spec: BuildSpec) -> Path:
    return strata_home() / "engines" / f"{backend}-{LLAMA_CPP_PYTHON_VERSION}-{build_key(spec)}"


def _read_meta(d: Path) -> dict[str, Any] | None:
    try:
        meta: dict[str, Any] = json.loads((d / META).read_text())
    except (OSError, ValueError):
        return None
    return meta if (Path(meta.get("site", "")) / "llama_cpp").is_dir() else None


def list_engines() -> list[EngineBuild]:
    root = strata_home() / "engines"
    found = []
    for d in sorted(root.glob("*")) if root.is_dir() else []:
        meta = _read_meta(d)
        if meta is not None:
            found.append(EngineBuild(meta["backend"], Path(meta["site"]), meta))
    return found


def find_engine(backend: str, spec: BuildSpec) -> EngineBuild | None:
    meta = _read_meta(engine_dir(backend, spec))
    return EngineBuild(backend, Path(meta["site"]), meta) if meta else None


@contextmanager
def _locked(path: Path, log: Log) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"another build holds {path}; waiting for it")
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def source_dir(log: Log) -> Path:
    """The pinned source release, unpacked once into $STRATA_HOME/src. Builds keep
    their CMake trees beside it, so peers (llama-server) build from the same tree."""
    unpacked = strata_home() / "src" / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
    if (unpacked / "pyproject.toml").is_file():
        return unpacked
    archive = fetch_source(log)
    with tarfile.open(archive) as tar:
        safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
        tar.extractall(unpacked.parent, **safe)  # type: ignore[arg-type]
    return unpacked


ORIGINAL = ".strata-original"


def apply_source_edits(tree: Path, edits: tuple[SourceEdit, ...], log: Log) -> None:
    """Write each edited file as its released text with ``edits`` applied. The released
    text is kept beside the file (``<name>.strata-original``) on the first edit, so a file
    an earlier build edited is edited afresh from the release, never twice."""
    by_path: dict[str, list[SourceEdit]] = {}
    for e in edits:
        by_path.setdefault(e.path, []).append(e)
    for rel, file_edits in by_path.items():
        path = tree / rel
        original = path.with_name(path.name + ORIGINAL)
        if not original.is_file():
            if not path.is_file():
                raise BuildError(f"cannot edit {rel}: the source release has no such file")
            shutil.copy2(path, original)
        text = original.read_text()
        for e in file_edits:
            if text.count(e.old) != 1:
                raise BuildError(
                    f"cannot edit {rel} ({e.why}): the text to replace occurs "
                    f"{text.count(e.old)} times in llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}, not once"
                )
            text = text.replace(e.old, e.new)
        if path.read_text() != text:
            path.write_text(text)
            log(f"edited {rel}: " + "; ".join(e.why for e in file_edits))


def fetch_source(log: Log) -> Path:
    """The pinned source archive, downloaded once into $STRATA_HOME/src."""
    src = strata_home() / "src"
    archive = src / SDIST
    if archive.is_file():
        return archive
    src.mkdir(parents=True, exist_ok=True)
    log(f"downloading llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} source release")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-python"]
    cmd += ["-d", str(src), f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not archive.is_file():
        raise BuildError(f"could not download {SDIST}:\n{done.stderr[-2000:]}")
    return archive


_PROGRESS = re.compile(r"\[(\d+)/(\d+)\]")


def _run_logged(cmd: list[str], env: dict[str, str], logfile: Path, label: str) -> int:
    """Run ``cmd`` writing everything to ``logfile``; show ninja's [n/m] progress."""
    tty = sys.stderr.isatty()
    last = 0.0
    with open(logfile, "w") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            m = _PROGRESS.search(line)
            now = time.monotonic()
            if m and (tty or now - last > 15):
                last = now
                msg = f"  {label}: compiled {m.group(1)}/{m.group(2)}"
                print(f"\r{msg}" if tty else msg, end="" if tty else "\n", file=sys.stderr)
        rc = proc.wait()
    if tty:
        print(file=sys.stderr)
    return rc


def _install(
    backend: Backend, spec: BuildSpec, target: Path, source: str, log: Log, meta: dict[str, Any]
) -> EngineBuild:
    d = target.parent
    tmp_site = d / "site.partial"
    shutil.rmtree(tmp_site, ignore_errors=True)
    env = dict(os.environ)
    env.update(spec.env)
    env["CMAKE_ARGS"] = " ".join(spec.cmake_args)
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation"]
    cmd += ["--no-cache-dir", "-v", "--target", str(tmp_site), source]
    if Path(source).is_dir():  # keep the CMake tree: peers build their targets from it
        cmd += ["--config-settings", f"build-dir={d / 'build'}"]
        meta["build_dir"] = str(d / "build")
    logfile = d / "build.log"
    started = time.monotonic()
    rc = _run_logged(cmd, env, logfile, f"building llama.cpp for {backend.name}")
    if rc != 0 or not (tmp_site / "llama_cpp").is_dir():
        tail = "".join(logfile.read_text(errors="replace").splitlines(True)[-40:])
        raise BuildError(
            f"building the {backend.name} engine failed (exit {rc}); last lines of {logfile}:\n"
            f"{tail}\nretry with: strata engine build --backend {backend.name}"
        )
    shutil.rmtree(target, ignore_errors=True)
    tmp_site.rename(target)
    meta.update(site=str(target), seconds=round(time.monotonic() - started, 1))
    (d / META).write_text(json.dumps(meta, indent=2))
    log(f"built the {backend.name} engine in {meta['seconds']} s: {d}")
    return EngineBuild(backend.name, target, meta)


def ensure_engine(backend: Backend, llama_cpp: str | None = None, log: Log = print) -> EngineBuild:
    """Reuse a finished build, or build one (or adopt ``llama_cpp``: a directory holding
    the ``llama_cpp`` package, or a wheel to install)."""
    spec = backend.build_spec()
    if llama_cpp and Path(llama_cpp).is_dir():
        site = Path(llama_cpp)
        if not (site / "llama_cpp").is_dir():
            raise BuildError(f"engine.llama_cpp = {llama_cpp}: no llama_cpp package in it")
        return EngineBuild(backend.name, site, {"backend": backend.name, "site": str(site)})
    found = find_engine(backend.name, spec)
    if found and not llama_cpp:
        return found
    missing = [t for t in spec.required_tools if shutil.which(t) is None and t != "cmake"]
    if missing:
        raise BuildError(f"cannot build the {backend.name} engine: {', '.join(missing)} not on PATH")
    d = engine_dir(backend.name, spec)
    with _locked(d.parent / f"{d.name}.lock", log):
        found = find_engine(backend.name, spec)
        if found and not llama_cpp:
            return found
        d.mkdir(parents=True, exist_ok=True)
        meta: dict[str, Any] = {
            "backend": backend.name,
            "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION,
            "cmake_args": list(spec.cmake_args),
            "env": dict(spec.env),
            "machine": platform.machine(),
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if llama_cpp:
            source = str(Path(llama_cpp).resolve())
            meta["source"] = source
        else:
            tree = source_dir(log)
            apply_source_edits(tree, spec.source_edits, log)
            meta["source_edits"] = [e.why for e in spec.source_edits]
            source = str(tree)
            log(f"building the {backend.name} engine (takes minutes; log: {d / 'build.log'})")
        return _install(backend, spec, d / "site", source, log, meta)
