"""Small GGUF models for tests and benchmarks, written with the ``gguf`` package.

- ``tokenizer``: a vocabulary-only copy of a model (its tokenizer and chat template).
- ``random``: a Llama-shaped model with random F16 weights carrying a real tokenizer,
  at any size (shapes below); the same seed gives the same file.
- ``reranker``: a Qwen3-shaped reranker with random weights, a real tokenizer and a
  classification head (``cls.output``, labels yes / no, pooling rank), as llama.cpp
  converts Qwen3-Reranker.
- ``lora``: a LoRA adapter for a model, random low-rank updates of its attention and
  feed-forward weights (the same seed gives the same file).
- ``truncate``: a model keeping only its first layers, e.g. a draft model for
  self-speculation that shares the vocabulary.
- ``write_with_template``: a model carrying another chat template.

    python -m strata_core.testing.models random --tokenizer tok.gguf --shape 1b out.gguf
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NamedTuple

import gguf
import numpy as np


class Shape(NamedTuple):
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int


SHAPES = {
    "tiny": Shape(64, 2, 4, 2, 128),
    "135m": Shape(576, 30, 9, 3, 1536),
    "1b": Shape(2048, 16, 32, 8, 8192),
    "8b": Shape(4096, 32, 32, 8, 14336),
}


def _copy_fields(
    reader: gguf.GGUFReader, writer: gguf.GGUFWriter, keep: Iterable[str], extra_tokens: int = 0
) -> None:
    prefixes = tuple(keep)
    for key, field in reader.fields.items():
        if not key.startswith(prefixes) or not field.types:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if extra_tokens and key == "tokenizer.ggml.tokens":
            value = [*value, *(f"<|strata_extra_{i}|>" for i in range(extra_tokens))]
        elif extra_tokens and key == "tokenizer.ggml.token_type":
            value = [*value, *[int(gguf.TokenType.USER_DEFINED)] * extra_tokens]
        writer.add_key_value(key, value, vtype, sub_type=sub)


def _arch_fields(reader: gguf.GGUFReader) -> str:
    arch = reader.fields["general.architecture"].contents()
    assert isinstance(arch, str)
    return arch


def write_tokenizer(src: Path, dst: Path, extra_tokens: int = 0) -> None:
    """A vocabulary-only GGUF: the tokenizer and chat template of ``src``, no tensors;
    ``extra_tokens`` appends that many user-defined tokens (a different vocabulary)."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dst, _arch_fields(reader))
    _copy_fields(reader, writer, ["tokenizer."], extra_tokens)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_random(
    tokenizer: Path,
    dst: Path,
    shape: Shape,
    seed: int = 0,
    n_ctx: int = 8192,
    fim: dict[str, int] | None = None,
    sampling: dict[str, float] | None = None,
) -> None:
    """A Llama of ``shape`` with random F16 weights and ``tokenizer``'s vocabulary; ``fim``
    names tokens of it as the fill-in-the-middle markers (``{"pre": id, "suf": .., "mid":
    .., "rep": .., "sep": ..}``), as a code model's GGUF does; ``sampling`` is its maker's
    defaults (``general.sampling.<key>``: temp, top_k, ...)."""
    reader = gguf.GGUFReader(tokenizer)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    writer = gguf.GGUFWriter(dst, "llama")
    writer.add_name(f"strata-random-{shape.n_layer}x{shape.n_embd}")
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_rope_dimension_count(shape.n_embd // shape.n_head)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    _copy_fields(reader, writer, ["tokenizer."])
    for role, token in (fim or {}).items():
        writer.add_uint32(f"tokenizer.ggml.fim_{role}_token_id", token)
    for key, value in (sampling or {}).items():  # llama.cpp's LLM_KV_GENERAL_SAMPLING_*
        vtype = gguf.GGUFValueType.INT32 if isinstance(value, int) else gguf.GGUFValueType.FLOAT32
        writer.add_key_value(f"general.sampling.{key}", value, vtype)
    rng = np.random.default_rng(seed)
    hd = shape.n_embd // shape.n_head
    e, kv, ff = shape.n_embd, shape.n_head_kv * hd, shape.n_ff

    def w(rows: int, cols: int) -> np.ndarray[Any, Any]:
        scale = 1.0 / np.sqrt(cols)
        return (rng.standard_normal((rows, cols), dtype=np.float32) * scale).astype(np.float16)

    ones = np.ones(e, dtype=np.float32)
    writer.add_tensor("token_embd.weight", w(n_vocab, e))
    writer.add_tensor("output_norm.weight", ones)
    for i in range(shape.n_layer):
        b = f"blk.{i}."
        writer.add_tensor(b + "attn_norm.weight", ones)
        writer.add_tensor(b + "attn_q.weight", w(e, e))
        writer.add_tensor(b + "attn_k.weight", w(kv, e))
        writer.add_tensor(b + "attn_v.weight", w(kv, e))
        writer.add_tensor(b + "attn_output.weight", w(e, e))
        writer.add_tensor(b + "ffn_norm.weight", ones)
        writer.add_tensor(b + "ffn_gate.weight", w(ff, e))
        writer.add_tensor(b + "ffn_up.weight", w(ff, e))
        writer.add_tensor(b + "ffn_down.weight", w(e, ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_reranker(tokenizer: Path, dst: Path, shape: Shape = SHAPES["tiny"], seed: int = 0) -> None:
    """A Qwen3 of ``shape`` with random F32 weights, ``tokenizer``'s vocabulary and a rank
    head: llama.cpp pools the last token through ``cls.output`` and a softmax over the
    labels, and a reranker's score is the first label's share."""
    reader = gguf.GGUFReader(tokenizer)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    writer = gguf.GGUFWriter(dst, "qwen3")
    hd = shape.n_embd // shape.n_head
    writer.add_name(f"strata-reranker-{shape.n_layer}x{shape.n_embd}")
    writer.add_context_length(4096)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head_kv)
    writer.add_key_length(hd)
    writer.add_value_length(hd)
    writer.add_rope_dimension_count(hd)
    writer.add_rope_freq_base(1000000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_pooling_type(gguf.PoolingType.RANK)
    writer.add_classifier_output_labels(["yes", "no"])
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    _copy_fields(reader, writer, ["tokenizer."])
    rng = np.random.default_rng(seed)
    e, kv, ff = shape.n_embd, shape.n_head_kv * hd, shape.n_ff

    def w(rows: int, cols: int) -> np.ndarray[Any, Any]:
        return rng.standard_normal((rows, cols), dtype=np.float32) / np.float32(np.sqrt(cols))

    writer.add_tensor("token_embd.weight", w(n_vocab, e))
    writer.add_tensor("output_norm.weight", np.ones(e, dtype=np.float32))
    writer.add_tensor("cls.output.weight", w(2, e) * np.float32(8.0))  # scores spread over (0, 1)
    for i in range(shape.n_layer):
        b = f"blk.{i}."
        for name, rows, cols in (("attn_q", e, e), ("attn_k", kv, e), ("attn_v", kv, e), ("attn_output", e, e),
                                 ("ffn_gate", ff, e), ("ffn_up", ff, e), ("ffn_down", e, ff)):  # fmt: skip
            writer.add_tensor(f"{b}{name}.weight", w(rows, cols))
        for name, n in (("attn_norm", e), ("ffn_norm", e), ("attn_q_norm", hd), ("attn_k_norm", hd)):
            writer.add_tensor(f"{b}{name}.weight", np.ones(n, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


#: The weights a ``write_lora`` adapter updates, in every block.
LORA_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_up", "ffn_down")


def write_lora(base: Path, dst: Path, rank: int = 8, seed: int = 0, strength: float = 1.0) -> None:
    """A LoRA adapter for ``base``: per target weight W (``n_in`` to ``n_out``), random
    ``lora_a`` (rank x n_in) and ``lora_b`` (n_out x rank) whose product, at scale 1, is an
    update about ``strength`` times as large as a unit-variance input's projection."""
    reader = gguf.GGUFReader(base)
    writer = gguf.GGUFWriter(dst, _arch_fields(reader))
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(rank))  # alpha / rank = 1: scale alone sets it
    rng = np.random.default_rng(seed)
    for t in reader.tensors:
        parts = t.name.split(".")
        if len(parts) != 4 or parts[0] != "blk" or parts[2] not in LORA_TARGETS:
            continue
        n_in, n_out = (int(x) for x in t.shape[:2])
        a = rng.standard_normal((rank, n_in), dtype=np.float32) / np.float32(np.sqrt(n_in))
        b = rng.standard_normal((n_out, rank), dtype=np.float32) * np.float32(strength / np.sqrt(rank))
        writer.add_tensor(f"{t.name}.lora_a", a)
        writer.add_tensor(f"{t.name}.lora_b", b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _rewrite(src: Path, dst: Path, n_layers: int | None = None, chat_template: str | None = None) -> None:
    """``src`` copied tensor for tensor, keeping only the first ``n_layers`` blocks and
    carrying ``chat_template`` instead of its own, when given."""
    reader = gguf.GGUFReader(src)
    arch = _arch_fields(reader)
    writer = gguf.GGUFWriter(dst, arch)
    skip = {"general.architecture"}
    if n_layers is not None:
        skip.add(f"{arch}.block_count")
    if chat_template is not None:
        skip.add(gguf.Keys.Tokenizer.CHAT_TEMPLATE)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in skip or not field.types:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    if n_layers is not None:
        writer.add_block_count(n_layers)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    for t in reader.tensors:
        if n_layers is not None and t.name.startswith("blk.") and int(t.name.split(".")[1]) >= n_layers:
            continue
        # For quantised types t.data holds bytes per row; the writer derives the shape.
        writer.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_truncated(src: Path, dst: Path, n_layers: int) -> None:
    """``src`` with only its first ``n_layers`` blocks, tensors copied as they are."""
    _rewrite(src, dst, n_layers=n_layers)


def write_with_template(src: Path, dst: Path, chat_template: str) -> None:
    """``src`` (weights, tokenizer and all) with another chat template, e.g. one that
    shows the model tools."""
    _rewrite(src, dst, chat_template=chat_template)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m strata_core.testing.models")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("tokenizer")
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p = sub.add_parser("random")
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--shape", choices=sorted(SHAPES), default="135m")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("dst", type=Path)
    p = sub.add_parser("reranker")
    p.add_argument("--tokenizer", type=Path, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("dst", type=Path)
    p = sub.add_parser("lora")
    p.add_argument("base", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("truncate")
    p.add_argument("src", type=Path)
    p.add_argument("dst", type=Path)
    p.add_argument("--layers", type=int, required=True)
    a = ap.parse_args(argv)
    if a.cmd == "tokenizer":
        write_tokenizer(a.src, a.dst)
    elif a.cmd == "random":
        write_random(a.tokenizer, a.dst, SHAPES[a.shape], a.seed)
    elif a.cmd == "lora":
        write_lora(a.base, a.dst, seed=a.seed)
    elif a.cmd == "reranker":
        write_reranker(a.tokenizer, a.dst, seed=a.seed)
    else:
        write_truncated(a.src, a.dst, a.layers)


if __name__ == "__main__":
    main()
