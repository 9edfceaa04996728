"""The CPU image of deploy/Containerfile, built and served from: a Debian base made with
debootstrap (no registry needed), ``podman build`` (the engine compiled in the build
stage), then the image's own entry point and environment run from its filesystem
(``podman mount`` + chroot, as its non-root user) answering a chat request.

Slow (the engine compiles in the build: tens of minutes on a few cores, minutes once the
build's cache holds it) and needs root, podman and debootstrap, so it has its own marker,
deselected by default: ``apt-get install podman debootstrap`` then
``pytest -m image tests/test_image.py``. STRATA_IMAGE_BASE names a base image to use
instead of making one; the images it builds stay (``podman rmi`` them)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from strata_core.testing.harness import free_port, wait_healthy

pytestmark = pytest.mark.image

REPO = Path(__file__).resolve().parent.parent
BASE = "localhost/strata-test-base:bookworm"
IMAGE = "localhost/strata-test:cpu"
MIRROR = os.environ.get("STRATA_DEBIAN_MIRROR", "http://deb.debian.org/debian")


@pytest.fixture(scope="module", autouse=True)
def asked_for(request: pytest.FixtureRequest) -> None:
    """Only where the marker is named (``-m "not slow"`` would select it otherwise)."""
    if "image" not in (request.config.option.markexpr or ""):
        pytest.skip("the image test runs only when asked for: pytest -m image")


def sh(*cmd: str, timeout: float = 600) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(cmd)}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout.strip()


def exists(image: str) -> bool:
    return subprocess.run(["podman", "image", "exists", image]).returncode == 0


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A Debian base image: STRATA_IMAGE_BASE, an earlier run's, or one made now."""
    for tool in ("podman", "debootstrap", "chroot", "unshare"):
        assert shutil.which(tool), f"{tool} is needed: apt-get install podman debootstrap"
    if os.environ.get("STRATA_IMAGE_BASE"):
        return os.environ["STRATA_IMAGE_BASE"]
    if exists(BASE):
        return BASE
    root = tmp_path_factory.mktemp("base") / "rootfs"
    sh("debootstrap", "--variant=minbase", "bookworm", str(root), MIRROR, timeout=1800)
    # the build machine's trust store: a TLS-intercepting proxy between it and the package index works
    bundle = Path(ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt")
    if bundle.is_file():
        shutil.copy(bundle, root / "usr/local/share/ca-certificates/build-host.crt")
    tar = root.parent / "rootfs.tar"
    with tarfile.open(tar, "w") as t:
        t.add(root, arcname=".")
    sh("podman", "import", str(tar), BASE)
    return BASE


@pytest.fixture(scope="module")
def image(base: str) -> dict[str, Any]:
    """The CPU image built from this checkout; its configuration (podman image inspect)."""
    # chroot isolation: a build that needs no container runtime (none may start on this host)
    sh("podman", "build", "--isolation=chroot", "--format", "docker", "-f", str(REPO / "deploy/Containerfile"),
       "--build-arg", f"BASE={base}", "-t", IMAGE, str(REPO), timeout=7200)  # fmt: skip
    [inspected] = json.loads(sh("podman", "image", "inspect", IMAGE))
    return {**inspected["Config"], "Healthcheck": inspected.get("Healthcheck")}  # podman puts it beside Config


@pytest.fixture(scope="module")
def served(image: dict[str, Any], default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The image's entry point run from its filesystem, as its user, with its environment
    and a model on its /models volume; the base URL once /health answers."""
    container = sh("podman", "create", IMAGE)
    root = Path(sh("podman", "mount", container))
    log = tmp_path_factory.mktemp("image") / "server.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        shutil.copy(default_model, root / "models/model.gguf")
        port = free_port()
        user = image["User"]
        argv = [*image["Entrypoint"], "--host", "127.0.0.1", "--port", str(port), "--model", "/models/model.gguf"]
        # its own mount namespace: /proc, /dev and /sys for the chroot, gone when it ends
        script = ('mount -t proc proc "$1/proc" && mount --rbind /dev "$1/dev" && mount --rbind /sys "$1/sys" '
                  '&& root=$1 && shift && exec chroot --userspec="$USERSPEC" "$root" "$@"')  # fmt: skip
        env = {**dict(e.split("=", 1) for e in image["Env"]), "USERSPEC": user}
        with open(log, "w") as out:
            proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
                                     str(root), "/usr/bin/env", "-u", "USERSPEC", *argv],
                                    stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)  # fmt: skip
        base = f"http://127.0.0.1:{port}"
        wait_healthy(proc, base, log, timeout=600)
        yield base
    finally:
        if proc is not None:
            stop(proc)
        subprocess.run(["podman", "umount", container], capture_output=True)
        subprocess.run(["podman", "rm", container], capture_output=True)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """The server, its engine and the chroot's shell: the session they run in."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except ProcessLookupError:  # it had exited (the log says why)
        return
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def test_the_image_is_set_up_as_the_containerfile_says(image: dict[str, Any]) -> None:
    assert image["User"] == "10001:10001"
    assert image["Entrypoint"] == ["strata", "serve"]
    assert "/health" in " ".join(image["Healthcheck"]["Test"])
    env = dict(e.split("=", 1) for e in image["Env"])
    assert env["STRATA_ENGINE_LLAMA_CPP"] == "/opt/strata/engine" and env["STRATA_BACKEND"] == "cpu"


def test_the_image_answers_a_chat_as_its_user_with_no_compiler(served: str, image: dict[str, Any]) -> None:
    client = openai.OpenAI(base_url=f"{served}/v1", api_key="unused", max_retries=0, timeout=300)
    model = client.models.list().data[0].id
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hello."}],
                                       max_tokens=8, temperature=0)  # fmt: skip
    assert r.choices[0].message.content and r.usage is not None and r.usage.prompt_tokens > 0
    container = sh("podman", "create", IMAGE)
    try:
        root = Path(sh("podman", "mount", container))
        assert not [c for c in ("usr/bin/g++", "usr/bin/gcc", "usr/bin/cc", "usr/bin/make") if (root / c).exists()]
        assert (root / "opt/strata/engine/llama_cpp").is_dir()
    finally:
        subprocess.run(["podman", "umount", container], capture_output=True)
        subprocess.run(["podman", "rm", container], capture_output=True)
