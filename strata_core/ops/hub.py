"""Models by reference on the Hugging Face hub: ``hf:OWNER/REPO[:QUANT][@REVISION]``.

``pull`` lists the repository's GGUF files with their LFS sha256, picks the quant asked
for (``Q4_K_M`` by default, as llama-server does), all parts of a split GGUF and an
``mmproj`` file beside it, and fetches them through ``huggingface_hub`` into its cache
(shared with other tools; downloads resume after a dropped connection or a stopped
pull: ``resumed_blob``; ``HF_TOKEN``, ``HF_ENDPOINT`` and ``HF_HUB_OFFLINE`` as
everywhere). A file fetched now is checked
against the hub's sha256 and removed from the cache when it differs. Nothing here runs
at import.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from strata_core.ops.models import ModelError

log = logging.getLogger("strata.hub")

PREFIX = "hf:"
DEFAULT_QUANT = "Q4_K_M"
_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}")
_QUANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_]{0,31}")
_REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)
#: A quant's name as GGUF files on the hub end in it: Q4_K_M, IQ2_XXS, Q8_0, F16, BF16, TQ1_0, MXFP4.
_QUANT_NAME = re.compile(r"^(?:I?Q\d(?:_[A-Z0-9]+)*|B?F\d{2}|TQ\d_\d|MXFP4(?:_[A-Z0-9]+)*)$", re.IGNORECASE)

Progress = Callable[["HubFile", int, "int | None"], None]  # file, bytes so far, total


@dataclass(frozen=True)
class HubRef:
    repo: str
    quant: str | None = None  # None: the default choice
    revision: str | None = None

    def __str__(self) -> str:
        quant = f":{self.quant}" if self.quant else ""
        rev = f"@{self.revision}" if self.revision else ""
        return f"{PREFIX}{self.repo}{quant}{rev}"


@dataclass(frozen=True)
class HubFile:
    name: str
    size: int | None = None
    sha256: str | None = None


@dataclass(frozen=True)
class Choice:
    """What one reference fetches: the model's parts (the first is the file llama.cpp
    opens), an mmproj file if the repository has one."""

    quant: str
    parts: tuple[HubFile, ...]
    mmproj: HubFile | None


@dataclass(frozen=True)
class Pulled:
    ref: HubRef
    quant: str
    path: Path  # the model's (first) file in the cache
    mmproj: Path | None
    commit: str


class HubUnreachable(ModelError):
    """The hub did not answer (the network, the hub itself): the cache may still serve."""


class NotOnHub(ModelError):
    """No such repository, revision or quant (or, offline, not in the cache)."""


def is_ref(text: str) -> bool:
    return text.startswith(PREFIX)


def parse_ref(text: str) -> HubRef:
    """``hf:OWNER/REPO[:QUANT][@REVISION]`` (``hf:`` optional); ModelError naming the part
    that is wrong (names with ``..``, slashes or other characters a path could use are)."""
    body = text.removeprefix(PREFIX)
    body, _, revision = body.partition("@")
    repo, _, quant = body.partition(":")
    if not _REPO.fullmatch(repo) or ".." in repo:
        raise ModelError(f"model reference {text!r}: the repository must be OWNER/NAME (letters, digits, "
                         "'-', '_', '.'), e.g. hf:bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M")  # fmt: skip
    if quant and not _QUANT.fullmatch(quant):
        raise ModelError(f"model reference {text!r}: the quant {quant!r} must be a name such as Q4_K_M "
                         "(letters, digits and '_')")  # fmt: skip
    if revision and (not _REVISION.fullmatch(revision) or ".." in revision):
        raise ModelError(f"model reference {text!r}: the revision {revision!r} must be a branch, tag or "
                         "commit hash (letters, digits, '-', '_', '.')")  # fmt: skip
    if quant.lower() == "latest":
        quant = ""
    return HubRef(repo, quant or None, revision or None)


def quant_of(name: str) -> str | None:
    """The quant a GGUF file's name ends in (``model-Q4_K_M-00001-of-00002.gguf``: Q4_K_M)."""
    stem = _SPLIT.sub("", Path(name).name)
    stem = stem[:-5] if stem.lower().endswith(".gguf") else stem
    last = re.split(r"[-.]", stem)[-1]
    return last.upper() if _QUANT_NAME.match(last) else None


def is_mmproj(name: str) -> bool:
    return "mmproj" in Path(name).name.lower()


def choose(files: list[HubFile], quant: str | None, repo: str) -> Choice:
    """The files one quant needs; ModelError listing the quants there are when it is not
    among them. No quant named: Q4_K_M, else the repository's only quant."""
    for f in files:
        if f.name.startswith("/") or ".." in f.name.split("/") or "\\" in f.name:
            raise ModelError(f"{repo}: the hub lists a file named {f.name!r}, outside the repository; refusing it")
    ggufs = [f for f in files if f.name.lower().endswith(".gguf")]
    models = [f for f in ggufs if not is_mmproj(f.name)]
    by_quant: dict[str, list[HubFile]] = {}
    for f in models:
        by_quant.setdefault(quant_of(f.name) or Path(f.name).stem, []).append(f)
    if not by_quant:
        raise NotOnHub(f"{repo} has no GGUF model files (is it a GGUF repository?)")
    want = (quant or DEFAULT_QUANT).upper()
    if want not in by_quant and quant is None and len(by_quant) == 1:
        want = next(iter(by_quant))
    if want not in by_quant:
        there = ", ".join(sorted(by_quant))
        raise NotOnHub(f"{repo} has no {want} GGUF; its quants: {there} (pick one: hf:{repo}:QUANT)")
    parts = sorted(by_quant[want], key=lambda f: f.name)
    split = [_SPLIT.search(f.name) for f in parts]
    if any(split):
        n = int(split[0].group(2)) if split[0] else 0
        if not all(split) or len(parts) != n:
            names = ", ".join(f.name for f in parts)
            raise ModelError(f"{repo}: the {want} split GGUF is incomplete on the hub ({names})")
    mmprojs = sorted((f for f in ggufs if is_mmproj(f.name)), key=lambda f: (quant_of(f.name) != "F16", f.name))
    return Choice(want, tuple(parts), mmprojs[0] if mmprojs else None)


# ---- the hub and its cache ---------------------------------------------------------------


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "on", "yes", "true")


def cache_dir() -> Path:
    """huggingface_hub's cache, found as it finds it (read now, not at import)."""
    env = os.environ
    if env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE"):
        return Path(env.get("HF_HUB_CACHE") or env["HUGGINGFACE_HUB_CACHE"]).expanduser()
    xdg = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(env.get("HF_HOME") or os.path.join(xdg, "huggingface")).expanduser() / "hub"


def repo_dir(repo: str) -> Path:
    return cache_dir() / ("models--" + repo.replace("/", "--"))


def network_errors() -> tuple[type[BaseException], ...]:
    """What huggingface_hub raises when the hub cannot be reached or fails (its HTTP client
    differs between versions)."""
    import importlib

    from huggingface_hub.errors import HfHubHTTPError

    found: list[type[BaseException]] = [HfHubHTTPError, OSError]
    for module, name in (("httpx2", "HTTPError"), ("httpx", "HTTPError"), ("requests", "RequestException")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return tuple(found)


def remote_files(ref: HubRef) -> tuple[list[HubFile], str]:
    """The repository's files (with LFS sha256) at the revision, and its commit."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        info = HfApi(endpoint=endpoint()).model_info(ref.repo, revision=ref.revision, files_metadata=True)
    except RevisionNotFoundError:
        raise NotOnHub(f"{ref}: the hub has no revision {ref.revision!r} of {ref.repo}") from None
    except RepositoryNotFoundError:
        raise NotOnHub(f"{ref}: no repository {ref.repo!r} on {endpoint()} (a private or gated one needs "
                         "HF_TOKEN)") from None  # fmt: skip
    except network_errors() as exc:
        raise HubUnreachable(f"{ref}: cannot reach the hub at {endpoint()}: {exc}") from None
    files = [HubFile(s.rfilename, s.lfs.size if s.lfs else s.size, s.lfs.sha256 if s.lfs else None)
             for s in info.siblings or ()]  # fmt: skip
    return files, info.sha or ref.revision or "main"


def cached_files(ref: HubRef) -> tuple[list[HubFile], str]:
    """Offline: the files of the revision already in the cache, and its commit."""
    root = repo_dir(ref.repo)
    rev = ref.revision or "main"
    ref_file = root / "refs" / rev
    commit = ref_file.read_text().strip() if ref_file.is_file() else rev
    snap = root / "snapshots" / commit
    if not snap.is_dir():
        raise NotOnHub(f"{ref}: offline (HF_HUB_OFFLINE) and {ref.repo} at {rev} is not in the cache "
                         f"{cache_dir()}; pull it while online first")  # fmt: skip
    files = [HubFile(p.relative_to(snap).as_posix()) for p in sorted(snap.rglob("*")) if p.is_file()]
    return files, commit


def remember(ref: HubRef, commit: str) -> None:
    """Point the cache's ref of the revision asked for (``main`` by default) at the commit
    fetched, as huggingface_hub does, so offline use finds it."""
    rev = ref.revision or "main"
    if rev != commit:
        path = repo_dir(ref.repo) / "refs" / rev
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(commit)


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _tracker(f: HubFile, progress: Progress | None) -> type[Any] | None:
    """A tqdm class that reports ``f``'s bytes to ``progress``."""
    if progress is None:
        return None
    from tqdm.auto import tqdm

    class Tracked(tqdm):  # type: ignore[misc,type-arg]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)
            self.done = int(kwargs.get("initial") or 0)

        def update(self, n: float | None = 1) -> bool | None:
            self.done += int(n or 0)
            assert progress is not None
            progress(f, self.done, self.total)
            return super().update(n)  # type: ignore[no-any-return]

    return Tracked


@contextmanager
def _bars(show: bool) -> Iterator[None]:
    """huggingface_hub's progress bars only on a terminal (logs get one line per file)."""
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    was = are_progress_bars_disabled()
    if not show:
        disable_progress_bars()
    try:
        yield
    finally:
        if not was:
            enable_progress_bars()


def refuse(ref: HubRef, f: HubFile, got: str) -> ModelError:
    return ModelError(f"{ref.repo}/{f.name}: the downloaded file's sha256 is {got}, the hub says "
                      f"{f.sha256}; it was removed from the cache (pull again)")  # fmt: skip


def resumed_blob(ref: HubRef, f: HubFile, commit: str, progress: Progress | None) -> bool:
    """Fetch an LFS file's blob into the cache from where an earlier pull stopped, checking
    its sha256: huggingface_hub (2.x) downloads into a temporary file it removes when the
    download fails, so a stopped pull would start the file over. The part fetched so far
    is kept as ``blobs/<sha256>.incomplete`` (the name older huggingface_hub resumed from)
    under its lock; ``hf_hub_download`` then links the whole blob into the snapshot. False
    (nothing done) for a file without a sha256, or whose blob is there already."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    if not f.sha256:
        return False
    sha = f.sha256.lower()
    blob = repo_dir(ref.repo) / "blobs" / sha
    partial = blob.with_name(sha + ".incomplete")
    lock = cache_dir() / ".locks" / repo_dir(ref.repo).name / f"{sha}.lock"
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(str(lock)):
        if blob.exists():
            return False
        with open(partial, "ab") as fh:
            if f.size is not None and fh.tell() > f.size:  # not a part of this file
                fh.truncate(0)
            url = hf_hub_url(ref.repo, f.name, revision=commit, endpoint=endpoint())
            http_get(url, fh, resume_size=fh.tell(), headers=build_hf_headers(), expected_size=f.size,
                     displayed_filename=Path(f.name).name, tqdm_class=_tracker(f, progress))  # fmt: skip
        got = sha256_of(partial)
        if got != sha:
            partial.unlink(missing_ok=True)
            raise refuse(ref, f, got)
        os.replace(partial, blob)
    return True


def fetch(ref: HubRef, f: HubFile, commit: str, progress: Progress | None = None, local: bool = False) -> Path:
    """One file into the cache (resuming after a dropped connection, or from where a
    stopped pull left it); a file fetched now whose sha256 differs from the hub's is
    removed and refused."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    had = try_to_load_from_cache(ref.repo, f.name, cache_dir=str(cache_dir()), revision=commit)
    fresh = not isinstance(had, str)
    checked = fresh and not local and resumed_blob(ref, f, commit, progress)
    path = Path(hf_hub_download(ref.repo, f.name, revision=commit, cache_dir=str(cache_dir()),
                                endpoint=endpoint(), local_files_only=local,
                                tqdm_class=_tracker(f, progress)))  # fmt: skip
    if fresh and f.sha256 and not checked:
        got = sha256_of(path)
        if got != f.sha256.lower():
            blob = path.resolve()
            path.unlink(missing_ok=True)
            blob.unlink(missing_ok=True)
            raise refuse(ref, f, got)
    size = path.stat().st_size
    what = "sha256 ok" if fresh and f.sha256 else "cached" if not fresh else "no sha256 on the hub"
    print(f"strata: {ref.repo}/{f.name}: {size / 1e6:.1f} MB, {what}", file=sys.stderr, flush=True)
    return path


@dataclass(frozen=True)
class Plan:
    """What a pull fetches: the choice from the hub's listing (or, offline or with the hub
    unreachable, from the cache's), at which commit."""

    ref: HubRef
    choice: Choice
    commit: str
    local: bool  # from the cache only

    @property
    def files(self) -> list[HubFile]:
        return [*self.choice.parts, *([self.choice.mmproj] if self.choice.mmproj else [])]

    @property
    def name(self) -> str:
        """The model's name once pulled, as the catalog names it (``OWNER/REPO:QUANT``)."""
        return f"{self.ref.repo}:{self.choice.quant}"


def plan(ref: HubRef) -> Plan:
    """List what ``ref`` names, fetching nothing: NotOnHub (no such repository, revision or
    quant), HubUnreachable (and nothing cached), ModelError (a listing refused)."""
    try:
        import huggingface_hub  # noqa: F401
    except ImportError:
        raise ModelError("model references need huggingface_hub: pip install huggingface_hub") from None
    local = offline()
    if not local:
        try:
            files, commit = remote_files(ref)
        except HubUnreachable as exc:
            try:  # as huggingface_hub does: what the cache has, when the hub cannot be reached
                files, commit = cached_files(ref)
            except ModelError:
                raise exc from None
            print(f"strata: warning: {exc}; using the cached files", file=sys.stderr, flush=True)
            local = True
    else:
        files, commit = cached_files(ref)
    try:
        return Plan(ref, choose(files, ref.quant, ref.repo), commit, local)
    except ModelError as exc:
        if not local:
            raise
        raise NotOnHub(f"offline, from the cache: {exc}") from None


def pull(ref: HubRef, progress: Progress | None = None, bars: bool | None = None, planned: Plan | None = None) -> Pulled:
    """Fetch what ``ref`` names (nothing when the cache has it); ``bars``: progress bars
    (default: when stderr is a terminal); ``planned``: its ``plan`` when already made."""
    p = planned or plan(ref)
    show = sys.stderr.isatty() if bars is None else bars
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        with _bars(show and progress is None):
            paths = [fetch(ref, f, p.commit, progress, p.local) for f in p.files]
    except LocalEntryNotFoundError as exc:
        raise HubUnreachable(f"{ref}: not in the cache and the hub cannot be reached: {exc}") from None
    except network_errors() as exc:
        raise HubUnreachable(f"{ref}: the download failed: {exc}") from None
    if not p.local:
        remember(ref, p.commit)
    mmproj = paths[len(p.choice.parts)] if p.choice.mmproj else None
    return Pulled(ref, p.choice.quant, paths[0], mmproj, p.commit)
