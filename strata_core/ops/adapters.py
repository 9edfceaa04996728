"""Whether a LoRA adapter GGUF fits a model, read with gguf before llama.cpp is asked to
load it: llama.cpp refuses the same adapters (llama-adapter.cpp), but says why only in
the engine's log."""

from __future__ import annotations

from pathlib import Path


class AdapterMissing(ValueError):
    """No file at the adapter's path."""


def check_adapter(adapter: Path, model: Path) -> None:
    """Raise AdapterMissing for no file, ValueError (saying why) for a file that is not a
    LoRA adapter of ``model``: another architecture, or weights of other shapes (a model
    of another size)."""
    import gguf

    if not adapter.is_file():
        raise AdapterMissing(f"No adapter found at {adapter}")
    try:
        lora, base = gguf.GGUFReader(adapter), gguf.GGUFReader(model)
    except (OSError, ValueError) as exc:
        raise ValueError(f"{adapter} is not a readable GGUF file: {exc}") from None

    def value(reader: gguf.GGUFReader, key: str) -> object:
        field = reader.fields.get(key)
        return field.contents() if field is not None and field.types else None

    if value(lora, "general.type") != "adapter" or value(lora, "adapter.type") != "lora":
        raise ValueError(f"{adapter} is not a LoRA adapter (its GGUF's general.type is "
                         f"{value(lora, 'general.type')!r}, adapter.type {value(lora, 'adapter.type')!r})")  # fmt: skip
    arch, base_arch = value(lora, "general.architecture"), value(base, "general.architecture")
    if arch != base_arch:
        raise ValueError(f"{adapter} is a LoRA adapter for a {arch} model; this model is a {base_arch}")
    shapes = {t.name: [int(n) for n in t.shape] for t in base.tensors}
    for t in lora.tensors:
        name, _, part = t.name.rpartition(".")
        if part not in ("lora_a", "lora_b") or name.endswith("token_embd.weight"):
            continue
        if name not in shapes:
            raise ValueError(f"{adapter} adapts {name}, which this model does not have (another base model?)")
        axis = 0 if part == "lora_a" else 1  # lora_a takes the weight's input, lora_b gives its output
        if int(t.shape[axis]) != shapes[name][axis]:
            raise ValueError(f"{adapter} does not fit this model: {t.name} has {int(t.shape[axis])} where {name} "
                             f"has {shapes[name][axis]} (an adapter for a model of another size)")  # fmt: skip
