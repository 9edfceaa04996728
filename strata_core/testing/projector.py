"""Small projectors with random weights, written with the ``gguf`` package, in the layouts
llama.cpp's mtmd loads with ``--mmproj``. Their output width is the text model's embedding
width, so they pair with any text model (the default model's is 576).

- vision: a CLIP vision tower and LLaVA's two-layer MLP projector (``clip.projector_type =
  mlp``). Images are resized to ``image_size`` pixels square and cut into ``patch_size``
  patches: each image takes ``(image_size // patch_size) ** 2`` positions of the text
  model's context (16 by default).
- audio: a Whisper-style encoder (two conv1d layers over the log-mel spectrogram, a few
  transformer blocks) and Ultravox's projector (``clip.projector_type = ultravox``: frames
  stacked ``stack`` at a time, RMS norm, SwiGLU, RMS norm, linear). mtmd resamples a clip to
  16 kHz and cuts its mel spectrogram (80 bins, 10 ms hop) into 30 s windows; each window is
  a media chunk of ``audio_tokens()`` positions (75 by default).

    python -m strata_core.testing.projector --n-embd 576 out-mmproj.gguf
    python -m strata_core.testing.projector --audio --n-embd 576 out-audio-mmproj.gguf

The same seed gives the same file.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NamedTuple

import gguf
import numpy as np


class VisionShape(NamedTuple):
    n_embd: int = 64
    n_layer: int = 2  # LLaVA takes the features of the second-to-last block
    n_head: int = 4
    n_ff: int = 128
    image_size: int = 32
    patch_size: int = 8
    mm_hidden: int = 128


class AudioShape(NamedTuple):
    n_embd: int = 64
    n_layer: int = 2
    n_head: int = 4
    n_ff: int = 128
    n_mel: int = 80  # Whisper's mel bins; mtmd builds the filter bank for any count
    stack: int = 20  # frames per projected position (divides the 1500 of a 30 s window)
    mm_hidden: int = 128


SMALL = VisionShape()
SMALL_AUDIO = AudioShape()
AUDIO_WINDOW_FRAMES = 3000  # mtmd's mel frames per 30 s window (10 ms hop)
OUT_SCALE = 1.0  # of the projector's last layer, over sqrt(fan-in)


def image_tokens(shape: VisionShape = SMALL) -> int:
    """The positions one image takes in the text model's context."""
    return (shape.image_size // shape.patch_size) ** 2


def audio_tokens(shape: AudioShape = SMALL_AUDIO) -> int:
    """The positions one 30 s window of audio takes in the text model's context (a clip
    takes a window per whole 30 s of it, and one more for the rest, which mtmd pads with silence)."""
    return AUDIO_WINDOW_FRAMES // 2 // shape.stack


def _weights(seed: int) -> Any:
    rng = np.random.default_rng(seed)

    def w(*dims: int, scale: float | None = None) -> np.ndarray[Any, Any]:
        fan_in = int(np.prod(dims[1:]))
        s = scale if scale is not None else 1.0 / np.sqrt(fan_in)
        return (rng.standard_normal(dims, dtype=np.float32) * s).astype(np.float32)

    return w


def _blocks(writer: gguf.GGUFWriter, w: Any, prefix: str, e: int, n_ff: int, n_layer: int, k_bias: bool = True) -> None:
    """The encoder's pre-norm transformer blocks (``prefix``: "v" vision, "a" audio)."""
    ones, zeros = np.ones(e, dtype=np.float32), np.zeros(e, dtype=np.float32)
    for i in range(n_layer):
        b = f"{prefix}.blk.{i}."
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            writer.add_tensor(b + name + ".weight", w(e, e))
            if k_bias or name != "attn_k":
                writer.add_tensor(b + name + ".bias", w(e, scale=0.02))
        for name in ("ln1", "ln2"):
            writer.add_tensor(b + name + ".weight", ones)
            writer.add_tensor(b + name + ".bias", zeros)
        writer.add_tensor(b + "ffn_up.weight", w(n_ff, e))
        writer.add_tensor(b + "ffn_up.bias", np.zeros(n_ff, dtype=np.float32))
        writer.add_tensor(b + "ffn_down.weight", w(e, n_ff))
        writer.add_tensor(b + "ffn_down.bias", zeros)


def _finish(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _encoder_keys(writer: gguf.GGUFWriter, kind: str, shape: VisionShape | AudioShape, n_embd_text: int) -> None:
    """The keys an encoder of either kind carries, under ``clip.{kind}.``."""
    writer.add_uint32(f"clip.{kind}.embedding_length", shape.n_embd)
    writer.add_uint32(f"clip.{kind}.feed_forward_length", shape.n_ff)
    writer.add_uint32(f"clip.{kind}.block_count", shape.n_layer)
    writer.add_uint32(f"clip.{kind}.projection_dim", n_embd_text)
    writer.add_uint32(f"clip.{kind}.attention.head_count", shape.n_head)
    writer.add_float32(f"clip.{kind}.attention.layer_norm_epsilon", 1e-5)


def write_vision_projector(dst: Path, n_embd_text: int, shape: VisionShape = SMALL, seed: int = 0) -> None:
    """An mmproj GGUF whose image embeddings are ``n_embd_text`` wide. The projector's last
    layer is scaled so that an image's embeddings weigh on the reply (different images,
    different greedy replies) without drowning the text around them."""
    writer = gguf.GGUFWriter(dst, "clip")
    writer.add_name("strata-random-mmproj")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_bool("clip.has_audio_encoder", False)
    writer.add_string("clip.projector_type", "mlp")
    writer.add_bool("clip.use_gelu", True)
    writer.add_uint32("clip.vision.image_size", shape.image_size)
    writer.add_uint32("clip.vision.patch_size", shape.patch_size)
    _encoder_keys(writer, "vision", shape, n_embd_text)
    writer.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    writer.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w = _weights(seed)
    e, p = shape.n_embd, shape.patch_size
    n_pos = image_tokens(shape)
    ones, zeros = np.ones(e, dtype=np.float32), np.zeros(e, dtype=np.float32)
    writer.add_tensor("v.patch_embd.weight", w(e, 3, p, p))
    writer.add_tensor("v.patch_embd.bias", w(e, scale=0.02))
    writer.add_tensor("v.position_embd.weight", w(n_pos, e, scale=0.02))
    writer.add_tensor("v.pre_ln.weight", ones)
    writer.add_tensor("v.pre_ln.bias", zeros)
    _blocks(writer, w, "v", e, shape.n_ff, shape.n_layer)
    writer.add_tensor("mm.0.weight", w(shape.mm_hidden, e))
    writer.add_tensor("mm.0.bias", np.zeros(shape.mm_hidden, dtype=np.float32))
    writer.add_tensor("mm.2.weight", w(n_embd_text, shape.mm_hidden, scale=OUT_SCALE / np.sqrt(shape.mm_hidden)))
    writer.add_tensor("mm.2.bias", np.zeros(n_embd_text, dtype=np.float32))
    _finish(writer)


def write_audio_projector(dst: Path, n_embd_text: int, shape: AudioShape = SMALL_AUDIO, seed: int = 0,
                          out_scale: float = OUT_SCALE) -> None:  # fmt: skip
    """An mmproj GGUF with an audio encoder only, whose embeddings are ``n_embd_text`` wide.
    ``out_scale`` scales the projector's last layer (over sqrt(fan-in)), so that a clip's
    embeddings weigh on the reply without drowning the text around them."""
    writer = gguf.GGUFWriter(dst, "clip")
    writer.add_name("strata-random-audio-mmproj")
    writer.add_bool("clip.has_vision_encoder", False)
    writer.add_bool("clip.has_audio_encoder", True)
    writer.add_string("clip.projector_type", "ultravox")
    writer.add_uint32("clip.audio.num_mel_bins", shape.n_mel)
    _encoder_keys(writer, "audio", shape, n_embd_text)
    writer.add_uint32("clip.audio.projector.stack_factor", shape.stack)
    w = _weights(seed)
    e, h = shape.n_embd, shape.mm_hidden
    ones, zeros = np.ones(e, dtype=np.float32), np.zeros(e, dtype=np.float32)
    # conv1d kernels as (out, in, width); their biases broadcast over the frames
    writer.add_tensor("a.conv1d.1.weight", w(e, shape.n_mel, 3))
    writer.add_tensor("a.conv1d.1.bias", w(e, 1, scale=0.02))
    writer.add_tensor("a.conv1d.2.weight", w(e, e, 3))
    writer.add_tensor("a.conv1d.2.bias", w(e, 1, scale=0.02))
    writer.add_tensor("a.position_embd.weight", w(AUDIO_WINDOW_FRAMES // 2, e, scale=0.02))
    _blocks(writer, w, "a", e, shape.n_ff, shape.n_layer, k_bias=False)  # Whisper's keys have no bias
    writer.add_tensor("a.post_ln.weight", ones)
    writer.add_tensor("a.post_ln.bias", zeros)
    stacked = e * shape.stack
    writer.add_tensor("mm.a.norm_pre.weight", np.ones(stacked, dtype=np.float32))
    writer.add_tensor("mm.a.mlp.1.weight", w(2 * h, stacked))  # SwiGLU: gate and value halves
    writer.add_tensor("mm.a.norm_mid.weight", np.ones(h, dtype=np.float32))
    writer.add_tensor("mm.a.mlp.2.weight", w(n_embd_text, h, scale=out_scale / np.sqrt(h)))
    _finish(writer)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m strata_core.testing.projector")
    ap.add_argument("--n-embd", type=int, default=576, help="the text model's embedding width")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--audio", action="store_true", help="an audio encoder (Ultravox) instead of a vision one")
    ap.add_argument("dst", type=Path)
    a = ap.parse_args(argv)
    write = write_audio_projector if a.audio else write_vision_projector
    write(a.dst, a.n_embd, seed=a.seed)


if __name__ == "__main__":
    main()
