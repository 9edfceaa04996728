"""Build the peer servers for side-by-side benchmarks from the same pinned sources.

llama.cpp's own ``llama-server`` (and ``llama-bench``, ``llama-batched-bench``, the
kernels' own speed with no server: bench.ceiling, and ``llama-quantize`` for the quantised
models of a GPU run) come from the llama.cpp vendored in the very
llama-cpp-python source release Strata builds its engine from. When the engine's CMake
tree is kept (``build_dir`` in its build.json), the server is built in that same tree,
so sources and flags are identical by construction and nothing compiles twice;
otherwise it is configured on its own with the backend's build spec.

    python -m bench.peers [--backend cpu] [--tool llama-batched-bench]   # prints its path
"""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

from strata_core.ops.build import ensure_engine, source_dir, strata_home
from strata_core.ops.plugins import load_registry

TARGETS = ["llama-server", "llama-bench", "llama-batched-bench", "llama-quantize"]
# No web UI: a benchmark needs none, and fetching prebuilt assets would reach the network.
TOOLS_ON = ["-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_COMMON=ON", "-DLLAMA_USE_PREBUILT_UI=OFF"]


def llama_server(backend_name: str) -> Path:
    return peer_binary(backend_name, "llama-server")


def peer_binary(backend_name: str, name: str, targets: list[str] | None = None) -> Path:
    """The path of ``name`` (one of ``TARGETS``), built for the backend (with ``targets``,
    default just ``name``) where not yet."""
    backend = load_registry().get(backend_name)
    spec = backend.build_spec()
    env = {**os.environ, **spec.env}
    jobs = str(os.cpu_count() or 2)
    engine = ensure_engine(backend)
    tree = engine.meta.get("build_dir")
    if tree and Path(tree, "CMakeCache.txt").is_file():
        build = Path(tree)
        # llama.cpp's tools add tools/mtmd themselves (llama-server links it): the engine's
        # own add of it (LLAVA_BUILD) would claim the same binary directory. Configured so
        # once (a binary of it is there): configuring again makes ninja rebuild the server.
        if not any(build.rglob(name)):
            subprocess.run(["cmake", str(build), *TOOLS_ON, "-DLLAVA_BUILD=OFF"], check=True, env=env)
    else:
        build = strata_home() / "peers" / f"{engine.path.parent.name}-build"
        src = source_dir(print) / "vendor" / "llama.cpp"
        args = [a for a in spec.cmake_args if not a.startswith("-DLLAVA")]
        subprocess.run(
            ["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
             "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", *TOOLS_ON, *args],
            check=True, env=env,
        )  # fmt: skip
    subprocess.run(["cmake", "--build", str(build), "-j", jobs, "--target", *(targets or [name])], check=True, env=env)
    found = sorted(build.rglob(name))
    binaries = [p for p in found if p.is_file() and os.access(p, os.X_OK)]
    if not binaries:
        raise FileNotFoundError(f"no {name} binary under {build}")
    return binaries[0]


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--tool", default="llama-server", choices=TARGETS)
    args = ap.parse_args()
    print(peer_binary(args.backend, args.tool, TARGETS))
