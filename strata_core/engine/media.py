"""Images and audio in the engine, through llama.cpp's multimodal library (mtmd).

A model's projector (``--mmproj``) is loaded beside it. ``MTOKENIZE`` hands the engine a
prompt's text pieces and media items (their file bytes, as sent): mtmd decodes each item
and tokenizes the whole, and the answer gives the prompt's token ids with each media item's
positions held by placeholders, and per item the key (a hash of its bytes) and the
positions it takes. The decoded items stay here, by key, until a ``GEN`` names them.

Inside the scheduler a media chunk's positions hold one negative id, the same for every
chunk with the same key (``media_runs.placeholder``): prefix reuse then compares media by their hash
as it compares tokens, and a conversation that sends the same image again reuses its
cache. An image is one chunk; mtmd cuts an audio clip into 30 s windows, a chunk each,
keyed apart by ``chunk_key``. A slot reaching such a run of ids encodes the chunk and
decodes its embeddings into its sequence (``MediaChunk.decode``), in a ``llama_decode`` of
its own, as llama-server does.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from collections import OrderedDict
from typing import Any

import llama_cpp.mtmd_cpp as mtmd

from strata_core.contract.protocol import MediaSpan
from strata_core.engine.llama import Llama

#: Decoded media items kept for a GEN to name (each is its pixels or samples, preprocessed).
KEEP_ITEMS = 64


class MediaError(ValueError):
    """A media item mtmd cannot take (it does not decode, or the model has no encoder for it)."""


def chunk_key(item: str, seen: dict[str, int]) -> str:
    """The key of a media chunk whose item's id is ``item``: mtmd cuts audio into 30 s
    windows, one chunk each under the clip's id, so the j-th chunk with that id in a prompt
    is keyed by the id and j (the first by the id alone). Equal bytes give equal chunks in
    the same order, so a key always names the same embeddings."""
    j = seen.get(item, 0)
    seen[item] = j + 1
    return item if j == 0 else hashlib.sha256(f"{item}/{j}".encode()).hexdigest()[:16]


class MediaChunk:
    """One tokenized media item (an mtmd input chunk we own)."""

    def __init__(self, owner: Projector, chunk: Any, key: str, n: int) -> None:
        self.owner, self.ptr, self.key, self.n = owner, chunk, key, n

    def __del__(self) -> None:
        if self.ptr:
            mtmd.mtmd_input_chunk_free(self.ptr)
            self.ptr = None

    def decode(self, llama: Llama, seq: int, pos: int) -> int:
        """Encode the item and decode its embeddings into ``seq`` from ``pos``; the next position."""
        new_pos = ctypes.c_int32(0)
        rc = mtmd.mtmd_helper_eval_chunk_single(
            self.owner.ctx, llama.ctx, self.ptr, pos, seq, llama.n_batch, False, ctypes.byref(new_pos)
        )
        if rc != 0:
            raise RuntimeError(f"mtmd could not encode or decode media item {self.key} (code {rc})")
        return int(new_pos.value)


class Projector:
    """A model's multimodal projector and the media items tokenized for requests to come."""

    def __init__(self, path: str, llama: Llama, threads: int) -> None:
        params = mtmd.mtmd_context_params_default()
        params.use_gpu = llama.on_gpu
        params.n_threads = threads
        # the vision/audio encoder's attention as the text model's, as llama-server sets it:
        # left on "auto", mtmd turns flash attention on where the model has it off, and the
        # media embeddings differ from llama-server's by the kernels' rounding
        params.flash_attn_type = llama.flash_attn_type
        params.print_timings = False
        ctx = mtmd.mtmd_init_from_file(path.encode(), llama.model, params)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not load the projector {path} for this model (the engine's log says why)")
        self.ctx = ctx
        self.vision = bool(mtmd.mtmd_support_vision(ctx))
        self.audio = bool(mtmd.mtmd_support_audio(ctx))
        # Tokenizing runs on the reader thread while the main thread encodes, as llama-server
        # tokenizes on its HTTP threads: only the kept items need a lock.
        self.lock = threading.Lock()
        self.items: OrderedDict[str, MediaChunk] = OrderedDict()

    @property
    def inputs(self) -> list[str]:
        return ["text"] + (["image"] if self.vision else []) + (["audio"] if self.audio else [])

    def tokenize(self, parts: list[tuple[str, bytes]]) -> tuple[list[int], list[MediaSpan]]:
        """``parts``: ("text", UTF-8 bytes) or ("media", file bytes), in prompt order. The
        prompt's ids (0 at media positions) and where each media item sits. Special tokens'
        text is read as those tokens; no BOS is added (the chat template writes it)."""
        bitmaps: list[Any] = []
        keep: list[Any] = []  # the ctypes objects the parts point to, alive through the call
        ptrs = []
        try:
            for i, (kind, data) in enumerate(parts):
                part = mtmd.mtmd_input_part()
                if kind == "text":
                    text = mtmd.mtmd_input_text(data, len(data), False, True)
                    keep.append(text)
                    part.text = ctypes.pointer(text)
                else:
                    bitmap = self._bitmap(data, sum(k != "text" for k, _ in parts[:i]))
                    bitmaps.append(bitmap)
                    part.bitmap = bitmap
                keep.append(part)
                ptrs.append(ctypes.pointer(part))
            array = (ctypes.POINTER(mtmd.mtmd_input_part) * len(ptrs))(*ptrs)
            chunks = mtmd.mtmd_input_chunks_init()
            try:
                rc = mtmd.mtmd_tokenize_from_parts(self.ctx, chunks, array, len(ptrs), False)
                if rc != 0:
                    raise MediaError(f"mtmd could not tokenize the prompt with its media (code {rc})")
                return self._layout(chunks)
            finally:
                mtmd.mtmd_input_chunks_free(chunks)
        finally:
            for bitmap in bitmaps:
                mtmd.mtmd_bitmap_free(bitmap)

    def _bitmap(self, data: bytes, index: int) -> Any:
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = mtmd.mtmd_helper_bitmap_init_from_buf(self.ctx, buf, len(data), False)
        if not bitmap:
            raise MediaError(f"media item {index} does not decode as an image or audio clip this build reads")
        is_audio = bool(mtmd.mtmd_bitmap_is_audio(bitmap))
        if (is_audio and not self.audio) or (not is_audio and not self.vision):
            mtmd.mtmd_bitmap_free(bitmap)
            kind = "audio" if is_audio else "images"
            raise MediaError(f"media item {index} is {'audio' if is_audio else 'an image'}; this model's projector takes no {kind}")
        mtmd.mtmd_bitmap_set_id(bitmap, hashlib.sha256(data).hexdigest()[:16].encode())
        return bitmap

    def _layout(self, chunks: Any) -> tuple[list[int], list[MediaSpan]]:
        ids: list[int] = []
        spans: list[MediaSpan] = []
        seen: dict[str, int] = {}  # chunks so far per item id
        for i in range(mtmd.mtmd_input_chunks_size(chunks)):
            chunk = mtmd.mtmd_input_chunks_get(chunks, i)
            if mtmd.mtmd_input_chunk_get_type(chunk) == mtmd.MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                toks = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                ids.extend(toks[k] for k in range(n.value))
                continue
            n_tokens = int(mtmd.mtmd_input_chunk_get_n_tokens(chunk))
            n_pos = int(mtmd.mtmd_input_chunk_get_n_pos(chunk))
            if n_pos != n_tokens:  # M-RoPE models: positions are not one per token
                raise MediaError("this projector places media with M-RoPE positions, which Strata does not support yet")
            raw = mtmd.mtmd_input_chunk_get_id(chunk)
            key = chunk_key(raw.decode() if raw else "", seen)
            self._keep(MediaChunk(self, mtmd.mtmd_input_chunk_copy(chunk), key, n_tokens))
            spans.append(MediaSpan(key, len(ids), n_tokens))
            ids.extend([0] * n_tokens)
        return ids, spans

    def _keep(self, item: MediaChunk) -> None:
        with self.lock:
            self.items[item.key] = item
            self.items.move_to_end(item.key)
            while len(self.items) > KEEP_ITEMS:
                self.items.popitem(last=False)

    def take(self, key: str) -> MediaChunk | None:
        with self.lock:
            return self.items.get(key)
