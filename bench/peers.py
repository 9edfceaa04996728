"""Build the peer servers for side-by-side benchmarks from the same pinned sources.

llama.cpp's own ``llama-server`` is compiled from the llama.cpp vendored in the very
llama-cpp-python source release Strata builds its engine from, with the same backend
flags. Usage: ``python bench/peers.py [--backend cpu]`` prints the binary's path.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from strata_core.build import LLAMA_CPP_PYTHON_VERSION, fetch_source, strata_home
from strata_core.plugins import load_registry


def llama_server(backend_name: str) -> Path:
    backend = load_registry().get(backend_name)
    spec = backend.build_spec()
    root = strata_home() / "peers" / f"llama-server-{backend_name}-{LLAMA_CPP_PYTHON_VERSION}"
    binary = root / "build" / "bin" / "llama-server"
    if binary.is_file():
        return binary
    src = root / "src"
    if not (src / "CMakeLists.txt").is_file():
        with tarfile.open(fetch_source(print)) as tar:
            prefix = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp/"
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(src, members=[m for m in members if m.name])
    args = [a for a in spec.cmake_args if not a.startswith("-DLLAVA")]
    env = {**os.environ, **spec.env}
    subprocess.run(
        ["cmake", "-S", str(src), "-B", str(root / "build"), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
         "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", *args],
        check=True, env=env,
    )  # fmt: skip
    jobs = str(os.cpu_count() or 2)
    subprocess.run(
        ["cmake", "--build", str(root / "build"), "-j", jobs, "--target", "llama-server", "llama-bench"],
        check=True, env=env,
    )  # fmt: skip
    return binary


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cpu")
    print(llama_server(ap.parse_args().backend))
    sys.exit(0)
