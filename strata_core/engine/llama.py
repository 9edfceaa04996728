"""A thin typed wrapper over libllama, through llama-cpp-python's ctypes bindings.

Only this module touches ``llama_cpp``; it is imported inside the engine process, whose
import path holds the backend's build.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from typing import Any, Literal

import llama_cpp.llama_cpp as ll
import numpy as np
import numpy.typing as npt


class LlamaError(RuntimeError):
    pass


@dataclass(frozen=True)
class ModelOptions:
    path: str
    n_ctx: int  # per sequence
    n_seq: int
    n_batch: int
    threads: int | None = None
    n_gpu_layers: int = 0
    flash_attn: bool | None = None
    split_mode: Literal["none", "layer", "tensor"] = "layer"
    tensor_split: tuple[float, ...] = ()  # empty: by each GPU's free memory
    main_gpu: int = 0
    cache_types: tuple[str, str] = ("f16", "f16")  # the KV cache's (keys, values), config.CACHE_TYPES
    loras: tuple[tuple[str, float], ...] = ()  # LoRA adapters: (path, the scale requests get by default)
    #: greedy rows' argmax computed by llama.cpp in the decode (its backend sampling), so
    #: only their token leaves the device; None: on a GPU
    device_greedy: bool | None = None
    outputs_per_seq: int = 1  # most logits rows a sequence has in one decode (a window's)


#: Each KV cache type's enum ggml_type value (ggml.h; the bindings lack BF16).
KV_TYPES = {"f16": 1, "bf16": 30, "q8_0": 8, "q5_1": 7, "q5_0": 6, "q4_1": 3, "q4_0": 2, "iq4_nl": 20}


#: llama.cpp's enum llama_pooling_type, by the names READY reports.
POOLINGS = {"none": ll.LLAMA_POOLING_TYPE_NONE, "mean": ll.LLAMA_POOLING_TYPE_MEAN, "cls": ll.LLAMA_POOLING_TYPE_CLS,
            "last": ll.LLAMA_POOLING_TYPE_LAST, "rank": ll.LLAMA_POOLING_TYPE_RANK}  # fmt: skip

#: llama.cpp's enum llama_split_mode (ROW, 2, is superseded by TENSOR and not offered).
SPLIT_MODES = {"none": ll.LLAMA_SPLIT_MODE_NONE, "layer": ll.LLAMA_SPLIT_MODE_LAYER, "tensor": ll.LLAMA_SPLIT_MODE_TENSOR}


def set_split(mparams: Any, opts: ModelOptions) -> dict[str, Any]:
    """Set how the model spreads over GPUs in ``mparams`` (llama_model_params); returns
    what the struct now holds, as READY reports it."""
    if opts.split_mode == "tensor" and not ll.llama_supports_gpu_offload():
        raise LlamaError("split_mode tensor needs a GPU build of llama.cpp; this one offloads nothing")
    n_max = int(ll.llama_max_devices())
    if len(opts.tensor_split) > n_max:
        raise LlamaError(f"tensor_split has {len(opts.tensor_split)} proportions; llama.cpp takes at most {n_max}")
    mparams.split_mode = SPLIT_MODES[opts.split_mode]
    mparams.main_gpu = opts.main_gpu
    if opts.tensor_split:
        # llama.cpp reads llama_max_devices() floats and copies them while loading
        mparams.tensor_split = (ctypes.c_float * n_max)(*opts.tensor_split)
    mode = {v: k for k, v in SPLIT_MODES.items()}[int(mparams.split_mode)]
    shares = [float(mparams.tensor_split[i]) for i in range(len(opts.tensor_split))] if opts.tensor_split else []
    return {"mode": mode, "main_gpu": int(mparams.main_gpu), "tensor_split": shares}


class Batch:
    """A llama_batch whose arrays are numpy views we own, so filling it is vectorised."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        seq_base = self.seq.ctypes.data
        self._seq_ptrs = (ctypes.POINTER(ctypes.c_int32) * capacity)(
            *[ctypes.cast(seq_base + 4 * i, ctypes.POINTER(ctypes.c_int32)) for i in range(capacity)]
        )
        self.raw = ll.llama_batch()
        self.raw.token = self.token.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.raw.embd = None
        self.raw.pos = self.pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.raw.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.raw.seq_id = ctypes.cast(self._seq_ptrs, ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)))
        self.raw.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.n = 0

    def clear(self) -> None:
        self.n = 0

    def add(self, tokens: npt.ArrayLike, pos0: int, seq: int, logits: Literal["none", "all"]) -> int:
        """Append tokens at positions pos0.. of ``seq``, with logits at none or all of
        them; returns the index of the first."""
        toks = np.asarray(tokens, dtype=np.int32)
        k, i = len(toks), self.n
        if i + k > self.capacity:
            raise LlamaError(f"batch overflow: {i}+{k} > {self.capacity}")
        self.token[i : i + k] = toks
        self.pos[i : i + k] = np.arange(pos0, pos0 + k, dtype=np.int32)
        self.seq[i : i + k] = seq
        self.logits[i : i + k] = 1 if logits == "all" else 0
        self.n = i + k
        return i

    def fill(self, token: list[int], pos: list[int], seq: list[int], logits: list[int]) -> None:
        """Set the whole batch from one list per field (a step's many short rows at once)."""
        n = len(token)
        if n > self.capacity:
            raise LlamaError(f"batch overflow: {n} > {self.capacity}")
        self.token[:n], self.pos[:n], self.seq[:n], self.logits[:n] = token, pos, seq, logits
        self.n = n

    def add_one(self, token: int, pos: int, seq: int) -> int:
        i = self.n
        self.token[i] = token
        self.pos[i] = pos
        self.seq[i] = seq
        self.logits[i] = 1
        self.n = i + 1
        return i


class Llama:
    """One model and one context holding ``n_seq`` sequences of ``n_ctx`` tokens each."""

    def __init__(self, opts: ModelOptions) -> None:
        ll.llama_backend_init()
        mparams = ll.llama_model_default_params()
        mparams.n_gpu_layers = opts.n_gpu_layers if opts.n_gpu_layers >= 0 else 0x7FFFFFFF
        self.split = set_split(mparams, opts)
        model = ll.llama_model_load_from_file(opts.path.encode(), mparams)
        if not model:
            # e.g. a main_gpu that is not visible, or an architecture without tensor mode
            split = f" with split {self.split} (the engine's log says why)" if opts.split_mode != "layer" else ""
            raise LlamaError(f"llama.cpp could not load the model {opts.path}{split}")
        self.model = model
        #: layers run on a GPU (whose backends replay a captured graph per batch shape)
        self.on_gpu = opts.n_gpu_layers != 0 and bool(ll.llama_supports_gpu_offload())
        self.vocab = ll.llama_model_get_vocab(model)
        self.n_vocab = int(ll.llama_vocab_n_tokens(self.vocab))
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = opts.n_ctx * opts.n_seq
        cparams.n_batch = opts.n_batch
        cparams.n_ubatch = min(opts.n_batch, 512)
        cparams.n_seq_max = opts.n_seq
        cparams.kv_unified = False
        cparams.no_perf = True
        # llama.cpp's default of 4 threads oversubscribes small machines: use the cores we have.
        threads = opts.threads or len(os.sched_getaffinity(0))
        cparams.n_threads = cparams.n_threads_batch = threads
        if opts.flash_attn is not None:
            cparams.flash_attn_type = (
                ll.LLAMA_FLASH_ATTN_TYPE_ENABLED if opts.flash_attn else ll.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
        cparams.type_k, cparams.type_v = (KV_TYPES[t] for t in opts.cache_types)
        device_greedy = self.on_gpu if opts.device_greedy is None else opts.device_greedy
        if device_greedy:  # sampling nodes are reserved per output a sequence may have
            cparams.n_outputs_max_per_seq = max(1, opts.outputs_per_seq)
        ctx = ll.llama_init_from_model(model, cparams)
        if not ctx:
            types = f" with cache types {'/'.join(opts.cache_types)}" if opts.cache_types != ("f16", "f16") else ""
            raise LlamaError(f"llama.cpp could not create a context{types} (out of memory? the engine's log says why)")
        self.ctx = ctx
        self.mem = ll.llama_get_memory(ctx)
        self.n_ctx = int(ll.llama_n_ctx_seq(ctx))
        self.n_batch = int(ll.llama_n_batch(ctx))
        self.n_seq = opts.n_seq
        self._piece_buf = ctypes.create_string_buffer(256)
        self._cparams = cparams
        #: the attention kernel asked for (llama.cpp's flash_attn_type: -1 auto, 0 off, 1 on)
        self.flash_attn_type = int(cparams.flash_attn_type)
        #: the embeddings context (``embed``), made on the first input
        self._embd_ctx: Any = None
        self.n_embd = int(ll.llama_model_n_embd_out(model))
        #: an input's most tokens: llama.cpp pools a sequence within one micro-batch
        self.embd_max_tokens = opts.n_batch
        self.pooling = self._own_pooling()
        self._load_loras(opts.loras)
        #: what READY reports of the KV cache: its types and its bytes per slot
        self.kv_cache = {"type_k": opts.cache_types[0], "type_v": opts.cache_types[1],
                         "bytes_per_slot": self._kv_bytes_per_slot(*opts.cache_types)}  # fmt: skip
        self._greedy_chains: list[Any] = [None] * self.n_seq  # alive while set: llama.cpp keeps a pointer
        self._on_device: list[tuple[tuple[int, float], ...] | None] = [None] * self.n_seq  # each one's bias
        #: whether a sequence's greedy rows may be picked in the decode (``greedy_on_device``)
        self.device_greedy = device_greedy and self._init_device_greedy()

    # ---- LoRA adapters ----------------------------------------------------------------

    def _load_loras(self, loras: tuple[tuple[str, float], ...]) -> None:
        self._loras: list[Any] = []  # by id; None where one was unloaded (ids stay put)
        self.lora_paths: list[str] = []  # by id
        #: each adapter's default scale, what a request without its own scales gets
        self.lora_scales: tuple[float, ...] = ()
        self._lora_now: tuple[float, ...] = ()  # the context has no adapters set yet
        for path, scale in loras:
            self.load_lora(path, scale)
        self.use_lora(None)

    def load_lora(self, path: str, scale: float = 0.0) -> int:
        """Load an adapter at default ``scale`` (0: no request gets it unasked); its id."""
        adapter = ll.llama_adapter_lora_init(self.model, path.encode())
        if not adapter:
            raise LlamaError(f"llama.cpp could not load the LoRA adapter {path} (for this model? the engine's log says why)")
        self._loras.append(adapter)
        self.lora_paths.append(path)
        self.lora_scales = (*self.lora_scales, scale)
        return len(self._loras) - 1

    def free_lora(self, i: int) -> None:
        """Unload adapter ``i``: out of the context first, then freed; its id is not reused."""
        adapter, self._loras[i] = self._loras[i], None
        self.lora_scales = tuple(0.0 if j == i else v for j, v in enumerate(self.lora_scales))
        self._lora_now = ()  # set again without it before anything decodes
        self.use_lora(self.lora_scales)
        ll.llama_adapter_lora_free(adapter)

    def lora_loaded(self) -> list[int]:
        return [i for i, a in enumerate(self._loras) if a is not None]

    def use_lora(self, scales: tuple[float, ...] | None) -> None:
        """Apply the adapters at ``scales`` (None: their default scales) to the decodes that
        follow; llama.cpp applies adapters per context, so requests with other scales must
        decode in calls of their own. Adapters loaded after ``scales`` was made get 0."""
        scales = self.lora_scales if scales is None else scales
        scales = (*scales, *(0.0,) * (len(self._loras) - len(scales)))
        if scales == self._lora_now or not self._loras:
            return
        # an adapter at scale 0 is left out, so the graph is the base model's own
        on = [(a, v) for a, v in zip(self._loras, scales, strict=True) if v != 0.0 and a is not None]
        adapters = (ll.llama_adapter_lora_p_ctypes * max(len(on), 1))(*(a for a, _ in on))
        values = (ctypes.c_float * max(len(on), 1))(*(v for _, v in on))
        if ll.llama_set_adapters_lora(self.ctx, adapters, len(on), values) != 0:
            raise LlamaError(f"llama.cpp could not set the LoRA scales {scales}")
        self._lora_now = scales

    # ---- greedy picks on the device ---------------------------------------------------

    def _init_device_greedy(self) -> bool:
        """Every sequence's greedy rows picked in the decode (``greedy_on_device``); False
        where llama.cpp cannot (split mode tensor, a backend without the ops)."""
        if not all(self.greedy_on_device(seq, ()) for seq in range(self.n_seq)):
            for seq in range(self.n_seq):
                self.greedy_on_device(seq, None)
            return False
        return True

    def greedy_on_device(self, seq: int, bias: tuple[tuple[int, float], ...] | None) -> bool:
        """Pick ``seq``'s rows in the decode as the argmax after adding ``bias`` ((id, value)
        pairs; None: hand back the rows' logits instead). Such rows carry their token
        (``sampled``), and when no row of a micro-batch belongs to a sequence without a
        pick, no logits leave the device. A change makes llama.cpp plan its graph again at
        the next decode. Whether it holds."""
        if self._on_device[seq] == bias:
            return True
        old = self._greedy_chains[seq]
        chain = None
        if bias is not None:  # a chain is set up for one context once: a fresh one each time
            chain = ll.llama_sampler_chain_init(ll.llama_sampler_chain_default_params())
            if bias:
                pairs = (ll.llama_logit_bias * len(bias))(*(ll.llama_logit_bias(t, v) for t, v in bias))
                ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_logit_bias(self.n_vocab, len(bias), pairs))
            ll.llama_sampler_chain_add(chain, ll.llama_sampler_init_greedy())
        # Set, replaced or refused (llama.cpp then drops the sequence's sampler): either
        # way the context no longer points at the old chain.
        ok = bool(ll.llama_set_sampler(self.ctx, seq, chain))
        if old is not None:
            ll.llama_sampler_free(old)
        if not ok and chain is not None:
            ll.llama_sampler_free(chain)
            chain = None
        self._greedy_chains[seq] = chain
        self._on_device[seq] = bias if ok else None
        return ok

    def sampled(self, rows: list[int], n: int) -> list[int]:
        """The argmax llama.cpp computed for each output row in ``rows`` of the last
        decode's ``n`` (rows of sequences with ``greedy_on_device``)."""
        get, ctx = ll.llama_get_sampled_token_ith, self.ctx
        tokens = [get(ctx, i - n) for i in rows]  # negative: counted in output rows
        if min(tokens) < 0:
            raise LlamaError(f"llama.cpp sampled no token for output row {rows[tokens.index(min(tokens))]}")
        return tokens

    # ---- decoding -----------------------------------------------------------------

    def decode(self, batch: Batch) -> None:
        batch.raw.n_tokens = batch.n
        rc = ll.llama_decode(self.ctx, batch.raw)
        if rc != 0:
            raise LlamaError(f"llama_decode failed with {rc}")

    def synchronize(self) -> None:
        """Wait for the device to finish what was decoded (decodes may run asynchronously)."""
        ll.llama_synchronize(self.ctx)

    def warm_up(self) -> None:
        """Decode a short prompt and then one token in sequence 0, and forget them.

        A context's first decodes pay for buffer allocation and thread start-up (about
        0.7 s on two CPU cores); done here, before READY, no request's latency carries it.
        """
        tok = max(int(ll.llama_vocab_bos(self.vocab)), 0)
        batch = Batch(8)
        batch.add([tok] * 4, 0, 0, "none")
        self.decode(batch)
        batch.clear()
        batch.add_one(tok, 4, 0)
        self.decode(batch)
        self.seq_trim(0, 0)

    def logits(self, i: int) -> npt.NDArray[np.float32]:
        """The logits row of batch index ``i`` (valid until the next decode)."""
        ptr = ll.llama_get_logits_ith(self.ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def outputs(self, n: int) -> npt.NDArray[np.float32]:
        """The last decode's ``n`` logits rows (those its batch asked for), in batch order,
        as one matrix (valid until the next decode)."""
        ptr = ll.llama_get_logits(self.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n, self.n_vocab))

    def seq_trim(self, seq: int, keep: int) -> None:
        """Drop the cached positions >= ``keep`` of ``seq``."""
        if not ll.llama_memory_seq_rm(self.mem, seq, keep, -1):
            ll.llama_memory_seq_rm(self.mem, seq, -1, -1)
            raise LlamaError(f"could not trim sequence {seq} to {keep}")

    def seq_save(self, seq: int) -> npt.NDArray[np.uint8] | None:
        """The state of ``seq`` (its cache) as bytes in host memory; None if llama.cpp refused."""
        size = int(ll.llama_state_seq_get_size(self.ctx, seq))
        buf = np.empty(size, dtype=np.uint8)
        n = int(ll.llama_state_seq_get_data(self.ctx, buf.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)), size, seq))
        return buf[:n] if n else None

    def seq_load(self, seq: int, state: npt.NDArray[np.uint8] | None) -> bool:
        """Replace the cache of ``seq`` with a saved ``state``; False, with ``seq`` empty, if
        llama.cpp refused."""
        ptr = state.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)) if state is not None else None
        if state is not None and ll.llama_state_seq_set_data(self.ctx, ptr, state.size, seq):
            return True
        ll.llama_memory_seq_rm(self.mem, seq, -1, -1)
        return False

    def seq_save_file(self, seq: int, path: str, tokens: list[int]) -> int:
        """Write ``seq``'s cache and the ``tokens`` it holds to ``path`` (llama.cpp's
        sequence file, as llama-server's slot save writes it); the bytes written, 0 if refused."""
        arr = (ll.llama_token * max(1, len(tokens)))(*tokens)
        return int(ll.llama_state_seq_save_file(self.ctx, path.encode(), seq, arr, len(tokens)))

    def seq_load_file(self, seq: int, path: str, most: int) -> tuple[list[int], int]:
        """Replace ``seq``'s cache with the one in ``path``: the tokens it holds (at most
        ``most``) and the bytes read; ([], 0), with ``seq`` empty, if llama.cpp refused."""
        arr = (ll.llama_token * max(1, most))()
        n = ctypes.c_size_t(0)
        read = int(ll.llama_state_seq_load_file(self.ctx, path.encode(), seq, arr, most, ctypes.byref(n)))
        if not read:
            ll.llama_memory_seq_rm(self.mem, seq, -1, -1)
            return [], 0
        return list(arr[: n.value]), read

    def seq_copy(self, src: int, dst: int) -> bool:
        """Replace the cache of ``dst`` with a copy of ``src``'s. Each sequence has a KV
        stream of its own, so the copy goes through host memory (llama_memory_seq_cp between
        streams is deferred to the next decode, after which a trim would come too late)."""
        return self.seq_load(dst, self.seq_save(src))

    # ---- embeddings -----------------------------------------------------------------

    def _meta(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(128)
        n = ll.llama_model_meta_val_str(self.model, key.encode(), buf, len(buf))
        return buf.value.decode("utf-8", "replace") if n >= 0 else None

    def _kv_bytes_per_slot(self, type_k: str, type_v: str) -> int:
        """One slot's KV cache in bytes: n_ctx tokens of fit.kv_bytes_per_token (the model's
        layer and head sizes from its GGUF, rows stored in ``type_*``)."""
        from strata_core.engine.fit import kv_bytes_per_token

        def meta(key: str) -> int | str | None:
            value = self._meta(key)
            if key == "general.architecture" or value is None:
                return value
            return int(value) if value.isdigit() else None  # a per-layer list: its key's default

        return kv_bytes_per_token(meta, (type_k, type_v)) * self.n_ctx

    def _own_pooling(self) -> str:
        """The pooling the model's GGUF names (embedding models carry one), else mean: a
        generative model names none, and per-token vectors are no answer to /v1/embeddings."""
        arch = self._meta("general.architecture")
        value = self._meta(f"{arch}.pooling_type") if arch else None
        names = {v: k for k, v in POOLINGS.items()}
        own = names.get(int(value)) if value and value.lstrip("-").isdigit() else None
        return "mean" if own in (None, "none") else own

    def _embeddings_context(self) -> Any:
        """A second context over the same weights, for embeddings only: the generation
        context's slots keep their caches, its logits stay the sampler's, and an input is
        pooled whole in one micro-batch (n_ubatch = n_batch = n_ctx, one sequence)."""
        cparams = ll.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = self.embd_max_tokens
        cparams.n_seq_max = 1
        cparams.embeddings = True
        cparams.pooling_type = POOLINGS[self.pooling]
        cparams.no_perf = True
        cparams.n_threads, cparams.n_threads_batch = self._cparams.n_threads, self._cparams.n_threads_batch
        cparams.flash_attn_type = self._cparams.flash_attn_type
        ctx = ll.llama_init_from_model(self.model, cparams)
        if not ctx:
            raise LlamaError("llama.cpp could not create the embeddings context (out of memory?)")
        return ctx

    def embed(self, ids: list[int]) -> npt.NDArray[np.float32]:
        """The pooled, unnormalised embedding of one input (at most ``embd_max_tokens``);
        for a ranker (pooling rank), its classification head's output, whose first value is
        the input's relevance score (llama-server's rule)."""
        if not 0 < len(ids) <= self.embd_max_tokens:
            raise LlamaError(f"an input holds 1..{self.embd_max_tokens} tokens, not {len(ids)}")
        if self._embd_ctx is None:
            self._embd_ctx = self._embeddings_context()
        ctx = self._embd_ctx
        batch = Batch(len(ids))
        batch.add(ids, 0, 0, "all")
        batch.raw.n_tokens = batch.n
        mem = ll.llama_get_memory(ctx)
        try:
            rc = ll.llama_decode(ctx, batch.raw)
            if rc != 0:
                raise LlamaError(f"llama_decode failed with {rc}")
            ptr = ll.llama_get_embeddings_seq(ctx, 0)
            if not ptr:
                raise LlamaError("llama.cpp returned no embedding")
            width = int(ll.llama_model_n_cls_out(self.model)) if self.pooling == "rank" else self.n_embd
            return np.ctypeslib.as_array(ptr, shape=(width,)).copy()
        finally:
            ll.llama_memory_clear(mem, True)  # each input alone, from position 0

    # ---- vocabulary -----------------------------------------------------------------

    def tokenize(self, text: bytes, add_special: bool, parse_special: bool) -> list[int]:
        cap = len(text) + 16
        buf = (ll.llama_token * cap)()
        n = ll.llama_tokenize(self.vocab, text, len(text), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (ll.llama_token * cap)()
            n = ll.llama_tokenize(self.vocab, text, len(text), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int, special: bool = True) -> bytes:
        n = ll.llama_token_to_piece(self.vocab, token, self._piece_buf, 256, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = ll.llama_token_to_piece(self.vocab, token, buf, -n, 0, special)
            return buf.raw[:n]
        return self._piece_buf.raw[:n]

    def grammar_tokenizer(self, eos: list[int]) -> Any:
        """An llguidance tokenizer over this vocabulary (0.36 s for SmolLM2's 49,152 tokens);
        ``eos``: the tokens that end a generation once the grammar is satisfied."""
        from llguidance.llamacpp import lltokenizer_from_vocab

        return lltokenizer_from_vocab(self.vocab, n_vocab=self.n_vocab, eos_token=eos)

    def is_eog(self, token: int) -> bool:
        return bool(ll.llama_vocab_is_eog(self.vocab, token))

    def facts(self) -> dict[str, Any]:
        """What READY reports about the model."""
        v = self.vocab

        def tok(fn: Any) -> int | None:
            t = int(fn(v))
            return t if t >= 0 else None

        tmpl = ll.llama_model_chat_template(self.model, None)
        rerank = ll.llama_model_chat_template(self.model, b"rerank") if self.pooling == "rank" else None
        eog = [t for t in range(self.n_vocab) if ll.llama_vocab_is_eog(v, t)]
        bos, eos = tok(ll.llama_vocab_bos), tok(ll.llama_vocab_eos)
        return {
            "n_vocab": self.n_vocab,
            "n_ctx": self.n_ctx,
            "n_ctx_train": int(ll.llama_model_n_ctx_train(self.model)),
            "n_params": int(ll.llama_model_n_params(self.model)),
            "n_embd": self.n_embd,
            "embeddings": {"pooling": self.pooling, "max_tokens": self.embd_max_tokens},
            "bos": bos,
            "eos": eos,
            "eot": tok(ll.llama_vocab_eot),
            "eog": eog,
            "bos_text": self.piece(bos).decode("utf-8", "replace") if bos is not None else "",
            "eos_text": self.piece(eos).decode("utf-8", "replace") if eos is not None else "",
            "add_bos": bool(ll.llama_vocab_get_add_bos(v)),
            "add_eos": bool(ll.llama_vocab_get_add_eos(v)),
            "chat_template": tmpl.decode("utf-8", "replace") if tmpl else None,
            "sep": tok(ll.llama_vocab_sep),
            # fill-in-the-middle markers (None: the model has none): infill prompts
            "fim": {k: tok(getattr(ll, f"llama_vocab_fim_{k}")) for k in ("pre", "suf", "mid", "rep", "sep")},
            "add_sep": bool(ll.llama_vocab_get_add_sep(v)),
            "rerank_template": rerank.decode("utf-8", "replace") if rerank else None,
            "system_info": ll.llama_print_system_info().decode("utf-8", "replace").strip(),
        }
