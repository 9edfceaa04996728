"""Pulling models by reference (strata_core/ops/hub.py) from a loopback server speaking the
hub's HTTP API (HF_ENDPOINT), into huggingface_hub's cache under a temporary HF_HOME."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest

from strata_core.ops import catalog, hub
from strata_core.ops.models import ModelError, resolve_model
from strata_core.testing.fake_hub import FakeHub

REPO = "acme/Tiny-GGUF"


def gguf_bytes(tag: str, size: int = 300_000) -> bytes:
    """A small GGUF (a Llama's metadata, one tensor of ``size`` bytes that ``tag`` sets)."""
    seed = hashlib.sha256(tag.encode()).digest()
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "m.gguf"
        w = gguf.GGUFWriter(path, "llama")
        w.add_context_length(2048)
        w.add_name(tag)
        w.add_tensor("pad", np.frombuffer((seed * (size // len(seed) + 1))[:size], dtype=np.int8).copy())
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path.read_bytes()


FILES = {
    "Tiny-Q4_K_M.gguf": gguf_bytes("q4"),
    "Tiny-Q8_0.gguf": gguf_bytes("q8"),
    "mmproj-Tiny-F16.gguf": gguf_bytes("mmproj", 5000),
    "Q2_K/Tiny-Q2_K-00001-of-00003.gguf": gguf_bytes("s1"),
    "Q2_K/Tiny-Q2_K-00002-of-00003.gguf": gguf_bytes("s2"),
    "Q2_K/Tiny-Q2_K-00003-of-00003.gguf": gguf_bytes("s3"),
    "README.md": b"# tiny\n",
}


@pytest.fixture()
def fake_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    with FakeHub() as h:
        h.add(REPO, FILES)
        monkeypatch.setenv("HF_ENDPOINT", h.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN"):
            monkeypatch.delenv(var, raising=False)
        yield h


def test_references_parse_and_refuse_what_a_path_could_use() -> None:
    assert hub.parse_ref("hf:a/b") == hub.HubRef("a/b")
    assert hub.parse_ref("hf:a/b:q8_0@v1.0") == hub.HubRef("a/b", "q8_0", "v1.0")
    assert hub.parse_ref("a/b:latest") == hub.HubRef("a/b")
    for bad, part in [("hf:../evil", "repository"), ("hf:a/../../x", "repository"), ("hf:a/b/c", "repository"),
                      ("hf:a/b:../../x", "quant"), ("hf:a/b@../x", "revision"), ("hf:/etc/passwd", "repository"),
                      ("hf:a/b:Q4/../x", "quant")]:  # fmt: skip
        with pytest.raises(ModelError, match=part):
            hub.parse_ref(bad)


def test_quant_names() -> None:
    assert hub.quant_of("x/Model-7B-Q4_K_M-00001-of-00002.gguf") == "Q4_K_M"
    assert hub.quant_of("model.iq2_xxs.gguf") == "IQ2_XXS"
    assert hub.quant_of("m-bf16.gguf") == "BF16"
    assert hub.quant_of("model.gguf") is None


def test_default_quant_fetches_q4_k_m_and_the_mmproj_beside_it(fake_hub: FakeHub) -> None:
    got = hub.pull(hub.parse_ref(f"hf:{REPO}"))
    assert got.quant == "Q4_K_M" and got.path.name == "Tiny-Q4_K_M.gguf"
    assert got.path.read_bytes() == FILES["Tiny-Q4_K_M.gguf"]
    assert got.mmproj is not None and got.mmproj.read_bytes() == FILES["mmproj-Tiny-F16.gguf"]
    assert got.commit == fake_hub.commit(REPO)
    assert str(hub.cache_dir()) in str(got.path)  # huggingface_hub's cache, shared with other tools
    assert not fake_hub.downloads("Tiny-Q8_0.gguf")
    # a model path everywhere: resolve_model takes the reference and exposes the mmproj
    m = resolve_model(f"hf:{REPO}:q4_k_m")
    assert (m.id, m.path, m.mmproj) == (f"{REPO}:Q4_K_M", got.path, got.mmproj)
    assert len(fake_hub.downloads("Tiny-Q4_K_M.gguf")) == 1  # the second time from the cache


def test_named_quant_and_a_missing_one_lists_those_there(fake_hub: FakeHub) -> None:
    assert hub.pull(hub.parse_ref(f"hf:{REPO}:Q8_0")).path.read_bytes() == FILES["Tiny-Q8_0.gguf"]
    with pytest.raises(ModelError, match=r"no Q5_K_M GGUF; its quants: Q2_K, Q4_K_M, Q8_0"):
        hub.pull(hub.parse_ref(f"hf:{REPO}:Q5_K_M"))


def test_split_gguf_is_fetched_whole(fake_hub: FakeHub) -> None:
    got = hub.pull(hub.parse_ref(f"hf:{REPO}:Q2_K"))
    assert got.path.name == "Tiny-Q2_K-00001-of-00003.gguf"
    for i in (1, 2, 3):
        name = f"Q2_K/Tiny-Q2_K-0000{i}-of-00003.gguf"
        assert (got.path.parent / Path(name).name).read_bytes() == FILES[name]
    assert [e.name for e in catalog.local_models()] == [f"{REPO}:Q2_K"]
    assert catalog.local_models()[0].size == sum(len(FILES[f"Q2_K/Tiny-Q2_K-0000{i}-of-00003.gguf"]) for i in (1, 2, 3))


def test_download_resumes_after_the_connection_is_cut(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub.constants

    # huggingface_hub keeps what it wrote in chunks of 10 MiB; smaller ones here, so a cut
    # half way through a small file leaves some of it written
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 16 * 1024)
    name = "Tiny-Q8_0.gguf"
    fake_hub.cut.add(name)
    got = hub.pull(hub.parse_ref(f"hf:{REPO}:Q8_0"))
    assert got.path.read_bytes() == FILES[name]
    first, second = fake_hub.downloads(name)
    assert "range" not in first
    start = int(second["range"].removeprefix("bytes=").split("-")[0])
    assert 0 < start < len(FILES[name])  # the second request asked only for the rest


def test_a_stopped_pull_resumes_where_it_stopped(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pull stopped mid-file (here by its progress callback, as a killed process would
    stop it) keeps what it wrote; the next pull asks only for the rest."""
    import huggingface_hub.constants

    chunk = 16 * 1024
    monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", chunk)
    name = "Tiny-Q8_0.gguf"

    class Stopped(Exception):
        pass

    def stop(f: hub.HubFile, done: int, total: int | None) -> None:
        if done > 2 * chunk:  # two chunks written, the third not
            raise Stopped

    with pytest.raises(Stopped):
        hub.pull(hub.parse_ref(f"hf:{REPO}:Q8_0"), progress=stop)
    assert catalog.local_models() == []
    got = hub.pull(hub.parse_ref(f"hf:{REPO}:Q8_0"))
    assert got.path.read_bytes() == FILES[name]
    first, second = fake_hub.downloads(name)
    assert "range" not in first and second["range"] == f"bytes={2 * chunk}-"
    assert not list(got.path.parents[2].glob("blobs/*.incomplete"))


def test_checksum_mismatch_is_refused_and_not_cached(fake_hub: FakeHub) -> None:
    fake_hub.corrupt.add("Tiny-Q8_0.gguf")
    with pytest.raises(ModelError, match="sha256"):
        hub.pull(hub.parse_ref(f"hf:{REPO}:Q8_0"))
    assert catalog.local_models() == []
    assert not [p for p in hub.cache_dir().rglob("*") if p.is_file() and p.stat().st_size > 100_000]
    fake_hub.corrupt.clear()
    assert hub.pull(hub.parse_ref(f"hf:{REPO}:Q8_0")).path.read_bytes() == FILES["Tiny-Q8_0.gguf"]


def test_offline_mode_uses_the_cache_only(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    online = hub.pull(hub.parse_ref(f"hf:{REPO}"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    n = len(fake_hub.requests)
    assert hub.pull(hub.parse_ref(f"hf:{REPO}")).path == online.path
    assert len(fake_hub.requests) == n  # nothing asked of the hub
    with pytest.raises(ModelError, match="offline"):
        hub.pull(hub.parse_ref(f"hf:{REPO}:Q8_0"))
    with pytest.raises(ModelError, match="offline"):
        hub.pull(hub.parse_ref("hf:acme/Other-GGUF"))


def test_an_unreachable_hub_falls_back_to_the_cache(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    online = hub.pull(hub.parse_ref(f"hf:{REPO}"))
    with FakeHub() as gone:
        url = gone.url
    monkeypatch.setenv("HF_ENDPOINT", url)  # nothing listens there now
    assert hub.pull(hub.parse_ref(f"hf:{REPO}")).path == online.path
    with pytest.raises(ModelError, match="cannot reach the hub"):
        hub.pull(hub.parse_ref("hf:acme/Other-GGUF"))


def test_revision_pin_token_and_unknown_names(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    commit = fake_hub.commit(REPO)
    assert hub.pull(hub.parse_ref(f"hf:{REPO}@{commit}")).commit == commit
    assert all(h.get("authorization") == "Bearer hf_secret" for _, _, h in fake_hub.requests)
    with pytest.raises(ModelError, match="no revision 'v9'"):
        hub.pull(hub.parse_ref(f"hf:{REPO}@v9"))
    with pytest.raises(ModelError, match="no repository 'acme/Nope'"):
        hub.pull(hub.parse_ref("hf:acme/Nope"))


def test_a_hub_listing_a_file_outside_the_repository_is_refused(fake_hub: FakeHub) -> None:
    fake_hub.add("acme/Evil-GGUF", {"../../evil-Q4_K_M.gguf": gguf_bytes("evil")})
    with pytest.raises(ModelError, match="outside the repository"):
        hub.pull(hub.parse_ref("hf:acme/Evil-GGUF"))
    assert not list(hub.cache_dir().parent.rglob("evil*"))


def test_catalog_names_and_rm(fake_hub: FakeHub) -> None:
    hub.pull(hub.parse_ref(f"hf:{REPO}"))
    hub.pull(hub.parse_ref(f"hf:{REPO}:Q8_0"))
    names = [e.name for e in catalog.local_models()]
    assert names == [f"{REPO}:Q4_K_M", f"{REPO}:Q8_0"]
    assert catalog.find(f"hf.co/{REPO.lower()}:latest").name == f"{REPO}:Q4_K_M"  # type: ignore[union-attr]
    assert catalog.find(f"{REPO}:q8_0").name == f"{REPO}:Q8_0"  # type: ignore[union-attr]
    assert catalog.find(f"{REPO}:Q2_K") is None
    q8 = catalog.find(f"{REPO}:Q8_0")
    assert q8 is not None
    catalog.remove(q8)
    assert [e.name for e in catalog.local_models()] == [f"{REPO}:Q4_K_M"]
    assert not q8.path.exists()
    assert catalog.local_models()[0].mmproj is not None  # kept: the other quant uses it


def test_strata_pull_shows_the_hub_clients_progress_bar_on_a_terminal(fake_hub: FakeHub) -> None:
    import fcntl
    import pty
    import struct
    import termios
    import threading

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    main, sub = pty.openpty()
    fcntl.ioctl(sub, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a new one is 0 wide: tqdm draws nothing
    shown = bytearray()

    def read() -> None:  # while it runs: a terminal's buffer is small
        while True:
            try:
                chunk = os.read(main, 65536)
            except OSError:  # the other end closed
                return
            if not chunk:
                return
            shown.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        done = subprocess.run([sys.executable, "-m", "strata_core.ops.cli", "pull", f"{REPO}:Q8_0"],
                              stdout=subprocess.PIPE, stderr=sub, env=env, timeout=120)  # fmt: skip
    finally:
        os.close(sub)
        reader.join(10)
        os.close(main)
    text = shown.decode(errors="replace")
    assert done.returncode == 0, text
    # tqdm's bar, as huggingface_hub draws it: the file's name, redrawn in place up to 100%
    bar = [ln for ln in text.split("\r") if "Tiny-Q8_0.gguf" in ln and "%|" in ln]
    assert bar and "100%" in bar[-1], text


def test_strata_pull_command_logs_one_line_per_file(fake_hub: FakeHub) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    done = subprocess.run([sys.executable, "-m", "strata_core.ops.cli", "pull", f"{REPO}:Q2_K"],
                          capture_output=True, text=True, env=env, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("strata: ")]
    assert len(lines) == 4 and all("sha256 ok" in ln for ln in lines), done.stderr  # 3 parts + mmproj
    assert "\r" not in done.stderr  # no progress bar off a terminal
    assert done.stdout.startswith(f"{REPO}:Q2_K ")
    listed = subprocess.run([sys.executable, "-m", "strata_core.ops.cli", "models"], capture_output=True, text=True,
                            env=env, timeout=120)  # fmt: skip
    row = next(ln for ln in listed.stdout.splitlines() if ln.startswith(f"{REPO}:Q2_K "))
    assert "llama" in row and "ctx 2048" in row
    bad = subprocess.run([sys.executable, "-m", "strata_core.ops.cli", "pull", f"{REPO}:Q9"], capture_output=True,
                         text=True, env=env, timeout=120)  # fmt: skip
    assert bad.returncode == 2 and "its quants: Q2_K, Q4_K_M, Q8_0" in bad.stderr
