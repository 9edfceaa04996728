"""``parallel = "auto"``: how many slots, of how much context each, fit the device.

The arithmetic follows llama.cpp's common/fit.cpp: what the model's weights, the KV cache
and the compute buffers will take is set against the device's free memory, leaving a
margin (fit.cpp's default target: 1 GiB a device); when even one slot of ``n_ctx`` does
not fit, the context shrinks, down to fit.cpp's minimum of 4096 tokens. Here the unknown
is the number of slots: the KV cache holds ``n_ctx`` tokens for each (the engine's
sequences are not unified), so slots = what is left after weights, compute and margin,
over the KV bytes of one slot, at most ``AUTO_MOST``.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable
from dataclasses import dataclass

MIB = 1 << 20
MARGIN = 1024 * MIB  # free memory left on the device (fit.cpp's --fit-target default)
N_CTX_MIN = 4096  # the least context per slot before giving up slots (fit.cpp's default)
#: The most slots "auto" gives a GPU: a step's host time grows by about 4 us a slot
#: (bench.host_step: 0.2 ms at 64 slots, 1 ms at 256) while a GPU's decode of 256 rows
#: costs little more than one of 64, so throughput keeps growing to here; llama.cpp's own
#: limit on sequences (LLAMA_MAX_SEQ) is 256 as well.
AUTO_MOST = 256
CPU_PARALLEL = 4  # a CPU's slots: its step cost grows with every row
#: Each KV cache type's block: (bytes, elements) (ggml's type traits; config.CACHE_TYPES).
KV_BLOCKS = {"f16": (2, 1), "bf16": (2, 1), "q8_0": (34, 32), "q5_1": (24, 32), "q5_0": (22, 32),
             "q4_1": (20, 32), "q4_0": (18, 32), "iq4_nl": (18, 32)}  # fmt: skip


@dataclass(frozen=True)
class Fit:
    slots: int
    n_ctx: int  # per slot
    free: int  # the device's free bytes before loading
    need: int  # bytes the weights, compute buffers and margin take before any slot
    kv_per_token: int

    def describe(self) -> str:
        return (f"parallel auto: {self.slots} slots x {self.n_ctx} tokens (free {self.free // MIB} MiB; "
                f"weights, compute and margin {self.need // MIB} MiB; KV {self.kv_per_token} bytes a token)")  # fmt: skip


def fit_slots(free: int, weights: int, compute: int, kv_per_token: int, n_ctx: int,
              margin: int = MARGIN, most: int = AUTO_MOST, n_ctx_min: int = N_CTX_MIN) -> Fit:  # fmt: skip
    """The slots (and context per slot) that fit ``free`` bytes: as many slots of
    ``n_ctx`` as the memory left after weights, compute buffers and margin holds, at most
    ``most``; one slot of a context cut to fit (not below ``min(n_ctx, n_ctx_min)``, in
    steps of 256) when not even one fits. ValueError when nothing fits."""
    for name, value in (("kv_per_token", kv_per_token), ("n_ctx", n_ctx), ("most", most)):
        if value <= 0:
            raise ValueError(f"{name}={value} is out of range: expected > 0")
    need = weights + compute + margin
    left = free - need
    slots = min(most, max(0, left) // (kv_per_token * n_ctx))
    if slots >= 1:
        return Fit(int(slots), n_ctx, free, need, kv_per_token)
    floor = min(n_ctx, n_ctx_min)
    ctx = max(0, left) // kv_per_token // 256 * 256
    if ctx < floor:
        raise ValueError(
            f"the model does not fit the device: {free // MIB} MiB free, {need // MIB} MiB for weights, compute "
            f"and margin, and {floor * kv_per_token // MIB} MiB for one slot of {floor} tokens "
            "(use a smaller model, a quantised one, or set [engine] parallel and n_ctx yourself)"
        )
    return Fit(1, int(ctx), free, need, kv_per_token)


def kv_bytes_per_token(meta: Callable[[str], object | None], cache_types: tuple[str, str] = ("f16", "f16")) -> int:
    """KV cache bytes one token takes, all layers, from the model's GGUF metadata (``meta``:
    key -> value or None): layers x (a key row + a value row), a row being KV heads x head
    size elements stored in ``cache_types`` (keys, values)."""
    arch = meta("general.architecture")

    def num(key: str, default: int | None = None) -> int:
        value = meta(f"{arch}.{key}")
        if value is None:
            if default is None:
                raise ValueError(f"the model's GGUF has no {arch}.{key}: cannot size its KV cache")
            return default
        if isinstance(value, (list, tuple)):  # per-layer lists: the largest
            value = max(value)
        return int(value)  # type: ignore[call-overload]

    heads = num("attention.head_count")
    head_dim = num("embedding_length") // heads
    kv_heads = num("attention.head_count_kv", heads)
    k, v = num("attention.key_length", head_dim), num("attention.value_length", head_dim)
    def row(n: int, kv_type: str) -> int:
        block_bytes, block = KV_BLOCKS[kv_type]
        return -(-n // block) * block_bytes

    return num("block_count") * (row(kv_heads * k, cache_types[0]) + row(kv_heads * v, cache_types[1]))


def compute_bytes(n_vocab: int, n_embd: int, n_ubatch: int) -> int:
    """An allowance for the compute buffers of a micro-batch: its logits and a few
    activations of each row (float32), as llama.cpp's graph keeps them at their peak."""
    return n_ubatch * 4 * (n_vocab + 16 * n_embd)


def auto_slots(model: str, n_ctx: int, n_ubatch: int, free: int | None, extra_weights: int = 0,
               cache_types: tuple[str, str] = ("f16", "f16")) -> Fit | None:  # fmt: skip
    """``parallel = "auto"`` for ``model`` on a device with ``free`` bytes (None: no GPU,
    where the caller keeps CPU_PARALLEL); ``extra_weights``: a draft model's bytes;
    ``cache_types``: the KV cache's (keys, values)."""
    if free is None:
        return None
    meta = gguf_meta(model)
    arch = meta("general.architecture")
    tokens = meta("tokenizer.ggml.tokens")
    n_vocab = len(tokens) if isinstance(tokens, (list, tuple)) else 0
    n_embd = int(meta(f"{arch}.embedding_length") or 0)  # type: ignore[call-overload]
    weights = os.path.getsize(model) + extra_weights  # what the device holds: the file's tensors
    return fit_slots(free, weights, compute_bytes(n_vocab, n_embd, n_ubatch),
                     kv_bytes_per_token(meta, cache_types), n_ctx)  # fmt: skip


def gguf_meta(path: str) -> Callable[[str], object | None]:
    """A GGUF file's metadata as ``key -> value`` (None where absent)."""
    from gguf import GGUFReader

    reader = GGUFReader(path)

    def get(key: str) -> object | None:
        field = reader.get_field(key)
        if field is None:
            return None
        return field.contents()

    return get


def device_free_memory(lib_dir: str) -> int | None:
    """Free bytes over the GPUs ggml sees (its backends loaded by ``llama_backend_init``),
    None when there is none. ``lib_dir``: where libggml-base lives, beside libllama."""
    try:
        ggml = ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"))
    except OSError:
        return None
    ggml.ggml_backend_dev_count.restype = ctypes.c_size_t
    ggml.ggml_backend_dev_get.restype = ctypes.c_void_p
    ggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
    ggml.ggml_backend_dev_type.restype = ctypes.c_int
    ggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
    ggml.ggml_backend_dev_memory.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)]
    total_free, gpus = 0, 0
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        if ggml.ggml_backend_dev_type(dev) != 1:  # GGML_BACKEND_DEVICE_TYPE_GPU
            continue
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        total_free, gpus = total_free + free.value, gpus + 1
    return total_free if gpus else None
