"""The models on this machine: every GGUF in the hub's cache (what ``strata pull`` and
``hf:`` references fetched, and other tools' downloads), named ``OWNER/REPO:QUANT``, with
the facts its GGUF metadata gives (architecture, trained context, chat template, the
maker's sampling defaults).

``strata models`` lists and removes them; ``[server] catalog = true`` serves them all,
each loaded on its first request.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

from strata_core.ops import hub

#: Prefixes Ollama clients put before a hub repository's name.
HOST_PREFIXES = ("hf.co/", "huggingface.co/")
#: Where a GGUF keeps its maker's sampling defaults (llama.cpp's LLM_KV_GENERAL_SAMPLING_*).
SAMPLING_PREFIX = "general.sampling."


@dataclass(frozen=True)
class GgufFacts:
    architecture: str | None
    context_length: int | None  # the trained context
    chat_template: str | None
    file_type: str | None  # e.g. Q4_K_M, from general.file_type
    name: str | None
    parameters: int | None = None  # weights, counted over the tensors
    #: the maker's sampling defaults: ``general.sampling.<key>`` as key -> value
    sampling: dict[str, float | int | str] = field(default_factory=dict)


@dataclass(frozen=True)
class Entry:
    repo: str
    quant: str
    path: Path  # the (first) file llama.cpp opens
    size: int  # bytes, all parts
    mmproj: Path | None
    commit: str

    @property
    def name(self) -> str:
        return f"{self.repo}:{self.quant}"


def gguf_facts(path: Path) -> GgufFacts:
    """What ``path``'s metadata says (None where it says nothing); read once per file version."""
    stat = path.stat()
    return _facts(path, stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _facts(path: Path, size: int, mtime_ns: int) -> GgufFacts:
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except Exception as exc:  # a truncated or garbage file fails the reader in many ways (IndexError, ...)
        raise ValueError(f"{path} is not a readable GGUF file: {type(exc).__name__}: {exc}") from None

    def value(key: str) -> object:
        field = reader.fields.get(key)
        return field.contents() if field is not None and field.types else None

    arch = value("general.architecture")
    ctx = value(f"{arch}.context_length") if isinstance(arch, str) else None
    ft = value("general.file_type")
    try:
        file_type = gguf.LlamaFileType(int(ft)).name.removeprefix("MOSTLY_") if isinstance(ft, int) else None
    except ValueError:
        file_type = None
    template = value("tokenizer.chat_template")
    name = value("general.name")
    sampling = {k.removeprefix(SAMPLING_PREFIX): _shortest(v) for k in reader.fields
                if k.startswith(SAMPLING_PREFIX) and isinstance(v := value(k), int | float | str)}  # fmt: skip
    return GgufFacts(
        arch if isinstance(arch, str) else None,
        int(ctx) if isinstance(ctx, int) else None,
        template if isinstance(template, str) and template.strip() else None,
        file_type,
        name if isinstance(name, str) else None,
        sum(int(t.n_elements) for t in reader.tensors) or None,
        sampling,
    )


def _shortest(value: float | int | str) -> float | int | str:
    """A float32 value as the shortest decimal that is that float32 (0.7, not 0.699999988)."""
    if not isinstance(value, float):
        return value
    import numpy as np

    return float(np.format_float_positional(np.float32(value), unique=True))


def facts_or_none(path: Path) -> GgufFacts:
    """``gguf_facts``, or nothing known for a file that cannot be read (a listing goes on)."""
    try:
        return gguf_facts(path)
    except (OSError, ValueError):
        return GgufFacts(None, None, None, None, None)


def _repo_of(folder: Path) -> str | None:
    parts = folder.name.split("--")
    return "/".join(parts[1:]) if parts[0] == "models" and len(parts) == 3 else None


def local_models() -> list[Entry]:
    """Every GGUF model in the hub's cache, one entry per repository and quant (the
    newest snapshot holding it), sorted by name."""
    found: dict[str, Entry] = {}
    root = hub.cache_dir()
    for folder in sorted(root.glob("models--*")) if root.is_dir() else ():
        repo = _repo_of(folder)
        snaps = folder / "snapshots"
        if repo is None or not snaps.is_dir():
            continue
        for snap in sorted(snaps.iterdir(), key=lambda p: p.stat().st_mtime):
            files = [hub.HubFile(p.relative_to(snap).as_posix()) for p in snap.rglob("*.gguf") if p.exists()]
            quants = {hub.quant_of(f.name) or Path(f.name).stem for f in files if not hub.is_mmproj(f.name)}
            for quant in quants:
                try:
                    choice = hub.choose(files, quant, repo)
                except ValueError:
                    continue  # an incomplete split download
                paths = [snap / f.name for f in choice.parts]
                mmproj = snap / choice.mmproj.name if choice.mmproj else None
                entry = Entry(repo, choice.quant, paths[0], sum(p.stat().st_size for p in paths), mmproj, snap.name)
                found[entry.name.lower()] = entry
    return sorted(found.values(), key=lambda e: e.name.lower())


def normalize(name: str) -> tuple[str, str | None]:
    """An Ollama-style model name as (repository, quant or None for the default):
    ``hf.co/owner/repo:Q4_K_M``, ``owner/repo``, ``owner/repo:latest``."""
    name = name.strip().removeprefix(hub.PREFIX)
    for prefix in HOST_PREFIXES:
        if name.lower().startswith(prefix):
            name = name[len(prefix) :]
    repo, _, quant = name.partition(":")
    return repo, (None if not quant or quant.lower() == "latest" else quant.upper())


def find(name: str, entries: list[Entry] | None = None) -> Entry | None:
    """The local model ``name`` means (no quant, or ``latest``: Q4_K_M, else the only one)."""
    repo, quant = normalize(name)
    mine = [e for e in (local_models() if entries is None else entries) if e.repo.lower() == repo.lower()]
    if quant is not None:
        return next((e for e in mine if e.quant == quant), None)
    default = [e for e in mine if e.quant == hub.DEFAULT_QUANT]
    return default[0] if default else (mine[0] if len(mine) == 1 else None)


def remove(entry: Entry) -> list[Path]:
    """Remove ``entry``'s files (and mmproj) from the cache: each snapshot link, and its blob
    unless another snapshot still links to it. The paths removed."""
    snap = entry.path.parent
    while snap.parent.name != "snapshots":
        snap = snap.parent
    folder = snap.parent.parent
    parts = [p for p in entry.path.parent.glob("*.gguf") if hub.quant_of(p.name) == entry.quant]
    links = {*parts, entry.path, *([entry.mmproj] if entry.mmproj else [])}
    mmproj_kept = entry.mmproj is not None and any(
        e.mmproj == entry.mmproj for e in local_models() if e.name != entry.name
    )
    if mmproj_kept and entry.mmproj is not None:
        links.discard(entry.mmproj)
    removed: list[Path] = []
    for link in sorted(links):
        blob = link.resolve()
        link.unlink(missing_ok=True)
        removed.append(link)
        others = [p for p in folder.glob("snapshots/*/**/*") if p.is_symlink() and p.resolve() == blob]
        if blob != link and not others and blob.exists():
            blob.unlink()
            removed.append(blob)
    for d in sorted({p.parent for p in links}, key=lambda p: len(p.parts), reverse=True):
        _rmdir_empty(d, folder)
    return removed


def _rmdir_empty(d: Path, stop: Path) -> None:
    while d != stop and d.is_dir() and not any(d.iterdir()):
        os.rmdir(d)
        d = d.parent
