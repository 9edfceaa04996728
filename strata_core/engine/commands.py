"""What each protocol command does to the engine (GEN starts a request, CANCEL ends one,
EMBED, VOCAB, TOKENIZE answer at once, SLOT acts on a slot: slots.py, LORA changes the
adapters: adapters.py); the process's loop (``__main__``) applies them between steps."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from strata_core.contract import protocol as proto
from strata_core.contract.options import GenOptions
from strata_core.engine import dry
from strata_core.engine.adapters import Adapters
from strata_core.engine.budget import ThinkBudget
from strata_core.engine.emitter import Emit
from strata_core.engine.grammar import Grammars
from strata_core.engine.llama import Llama
from strata_core.engine.loop import Engine
from strata_core.engine.request import Request
from strata_core.engine.slots import slot_action
from strata_core.engine.stages import InfillVocab, SamplerState

_BREAKER_SETS = 16  # DRY breaker sets kept matched to the vocabulary (0.2 s each on 49k tokens)


class Commands:
    def __init__(
        self, llama: Llama, engine: Engine, emit: Emit, spec_k: int, has_drafter: bool, projector: Any = None
    ) -> None:
        self.llama = llama
        self.projector = projector  # media.Projector, with --mmproj
        self.engine = engine
        self.emit = emit
        self.spec_k = spec_k
        self.has_drafter = has_drafter
        self.eog = frozenset(llama.facts()["eog"])
        self.grammars = Grammars(lambda: llama.grammar_tokenizer(sorted(self.eog)), llama.n_vocab)
        self.warned: set[str] = set()
        self.adapters = Adapters(llama, engine)
        self._pieces: tuple[bytes, ...] | None = None  # the vocabulary's pieces, once VOCAB or DRY needs them
        self._breakers: dict[tuple[str, ...], dry.Breakers] = {}  # by breaker texts
        self._infill: InfillVocab | None = None  # the infill stage's, once a request's order has it

    def handle(self, cmd: Any) -> bool:
        """Apply one command; False once QUIT was seen."""
        if isinstance(cmd, proto.ProtocolError):
            self.emit(proto.Error(None, str(cmd)))
        elif isinstance(cmd, proto.Gen):
            self.start(cmd)
        elif isinstance(cmd, proto.Cancel):
            self.engine.cancel(cmd.rid)
        elif isinstance(cmd, proto.Embed):
            self.embed(cmd)
        elif isinstance(cmd, proto.LoraLoad | proto.LoraUnload | proto.LoraScales):
            self.emit(self.adapters.handle(cmd))
        elif isinstance(cmd, proto.VocabRequest):
            self.emit(proto.Vocab(cmd.rid, self.pieces()))
        elif isinstance(cmd, proto.SlotCommand):
            self.emit(slot_action(cmd, self.engine.slots, self.llama, self.spec_k > 0))
        elif isinstance(cmd, proto.Quit):
            return False
        return True

    def answer_now(self, write_now: Emit) -> Callable[[Any], bool]:
        """TOKENIZE is answered by the reader thread at once, even while a step decodes:
        it reads only the vocabulary, and a new request's prompt must not wait behind the
        prefill of the one before it. So is MTOKENIZE (media decoded and preprocessed by
        mtmd, as llama-server does on its HTTP threads)."""

        def answer(cmd: Any) -> bool:
            if isinstance(cmd, proto.MediaTokenize):
                write_now(media_tokens(cmd, self.projector))
                return True
            if not isinstance(cmd, proto.Tokenize):
                return False
            ids = self.llama.tokenize(cmd.text.encode("utf-8"), False, cmd.special)
            write_now(proto.Tokens(cmd.rid, tuple(ids)))
            return True

        return answer

    def start(self, cmd: proto.Gen) -> None:
        llama = self.llama

        def fail(msg: str) -> None:
            self.emit(proto.Error(cmd.rid, msg))
            self.emit(proto.Done(cmd.rid, "error", {}))

        keys = dict(cmd.keys)
        media_field = keys.pop("media", None)
        for key in GenOptions.unknown(keys):
            if key not in self.warned:
                self.warned.add(key)
                self.emit(proto.Warn(cmd.rid, f"unknown key {key}"))
        prompt = list(cmd.prompt)
        if not prompt:
            return fail("empty prompt")
        if len(prompt) >= llama.n_ctx:
            return fail(f"prompt has {len(prompt)} tokens; the context holds {llama.n_ctx}")
        bad = [t for t in prompt if t >= llama.n_vocab]
        if bad:
            return fail(f"prompt token {bad[0]} is outside the vocabulary (n_vocab {llama.n_vocab})")
        media = {}
        if media_field is not None:
            try:
                media = place_media(prompt, proto.parse_spans(media_field), self.projector)
            except (ValueError, proto.ProtocolError) as exc:
                return fail(str(exc))
        try:
            opts = GenOptions.decode(keys)
            opts.check(llama.n_vocab)
            if opts.spec == "draft" and not self.has_drafter:
                raise ValueError("spec=draft needs a draft model: start the engine with --draft-model PATH")
            grammar = self.grammars.matcher(opts.grammar) if opts.grammar is not None else None
        except ValueError as exc:
            return fail(str(exc))
        unknown = sorted(set(opts.lora) - set(llama.lora_loaded()))
        if unknown:
            return fail(f"lora names adapter {unknown[0]}; this engine has {llama.lora_loaded() or 'none'} loaded")
        # other adapter scales than the defaults in force: decoded apart, no shared cache
        lora = self.adapters.own_scales(dict(opts.lora or {}))
        s = opts.sampling
        state = SamplerState(breakers=self.breakers(s.dry_sequence_breakers) if s.dry else {},
                             infill=self.infill_vocab() if s.infill else None)  # fmt: skip
        budget = None
        if opts.think_budget is not None:  # forced tokens: no speculative windows for it
            budget = ThinkBudget(opts.think_budget, opts.think_close, llama.piece, opts.think_open)
        self.engine.submit(
            Request(cmd.rid, prompt, opts.sampling, opts.max_tokens or llama.n_ctx, frozenset(opts.stop_ids) | self.eog,
                    opts.logprobs, logprobs_processed=opts.logprobs_mode == "processed", grammar=grammar,
                    spec_k=self.spec_k if opts.spec != "off" and budget is None and not media and not s.windowless else 0,
                    spec_draft=opts.spec == "draft" and not media and not s.windowless, isolate=opts.isolate or lora is not None,
                    budget=budget, lora=lora, media=media, sampling=state)
        )  # fmt: skip

    def pieces(self) -> tuple[bytes, ...]:
        """Every token's piece, specials written out (built once, on first use)."""
        if self._pieces is None:
            self._pieces = tuple(self.llama.piece(t) for t in range(self.llama.n_vocab))
        return self._pieces

    def breakers(self, texts: tuple[str, ...]) -> dry.Breakers:
        """DRY's breaker sequences for ``texts`` on this vocabulary (computed once a set)."""
        if texts not in self._breakers:
            if len(self._breakers) >= _BREAKER_SETS:  # clients' own sets: keep the latest few
                del self._breakers[next(iter(self._breakers))]
            self._breakers[texts] = dry.breakers(texts, self.pieces(), lambda b: self.llama.tokenize(b, False, False))
        return self._breakers[texts]

    def infill_vocab(self) -> InfillVocab:
        """The vocabulary as the infill stage reads it (built once, on first use)."""
        if self._infill is None:
            llama, facts = self.llama, self.llama.facts()
            end = facts["eot"] if facts["eot"] is not None else facts["eos"]
            pieces = tuple(llama.piece(t, special=False) for t in range(llama.n_vocab))
            self._infill = InfillVocab(pieces, self.eog, -1 if end is None else end)
        return self._infill

    def embed(self, cmd: proto.Embed) -> None:
        """One input's embedding, between two steps (on the main thread, the only one that
        decodes: the embeddings context shares the model and the cores)."""
        llama = self.llama
        bad = [t for t in cmd.ids if t >= llama.n_vocab]
        if bad:
            self.emit(proto.Error(cmd.rid, f"token {bad[0]} is outside the vocabulary (n_vocab {llama.n_vocab})"))
            return
        try:
            vector = llama.embed(list(cmd.ids))
        except Exception as exc:  # an input too long, no memory for the context: this request's error
            self.emit(proto.Error(cmd.rid, f"embedding failed: {exc}"))
            return
        if not np.isfinite(vector).all():
            self.emit(proto.Error(cmd.rid, "the model's embedding is not finite"))
            return
        self.emit(proto.Embedding(cmd.rid, tuple(vector.tolist())))


def media_tokens(cmd: proto.MediaTokenize, projector: Any) -> proto.Event:
    """The answer to MTOKENIZE: the prompt's ids and media spans, or why not."""
    if projector is None:
        return proto.Error(cmd.rid, "this model has no projector (start the engine with --mmproj): it takes text only")
    from strata_core.engine.media import MediaError

    try:
        ids, spans = projector.tokenize(list(cmd.parts))
    except MediaError as exc:
        return proto.Error(cmd.rid, str(exc))
    return proto.MediaTokens(cmd.rid, tuple(ids), tuple(spans))


def place_media(prompt: list[int], spans: tuple[proto.MediaSpan, ...], projector: Any) -> dict[int, Any]:
    """Write each media span's placeholder into ``prompt`` (in place); the media items by
    placeholder, for the scheduler. Raises ValueError for spans the prompt cannot hold."""
    from strata_core.engine.media_runs import placeholder

    if projector is None:
        raise ValueError("this model has no projector (start the engine with --mmproj): it takes text only")
    items: dict[int, Any] = {}
    end = 0
    for sp in spans:
        item = projector.take(sp.key)
        if item is None:
            raise ValueError(f"media item {sp.key} is not known here (send MTOKENIZE first, or again)")
        if sp.n != item.n or sp.pos < end or sp.pos + sp.n >= len(prompt):
            raise ValueError(f"media item {sp.key} cannot sit at {sp.pos}+{sp.n} (it takes {item.n} "
                             "positions, in order, before the prompt's last token)")  # fmt: skip
        prompt[sp.pos : sp.pos + sp.n] = [placeholder(sp.key)] * sp.n
        items[placeholder(sp.key)] = item
        end = sp.pos + sp.n
    return items
