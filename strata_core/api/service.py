"""The request path every API shares (docs/architecture.md, "One request's path"): the
engine's vocabulary and chat template, admission, a run of choices started
(:meth:`Service.start_run`, the one sequence every family runs: the reply's constraint,
the seed, the token limit, each choice's options), and one choice followed from GEN to
its last piece. The roles it draws on have modules of their own: the chat prompt
(prompts.py), constraints and tool-call grammars (constraints.py), a choice's engine
options (choice_options.py). An API family's module (completions.py, responses.py ...)
turns its request into these calls and their pieces into its bodies."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi import Request

from strata_core.api.choice_options import ChoiceOptions
from strata_core.api.constraints import ToolGrammars, constrain, grammar_refused
from strata_core.api.limits import queue_full, read_json
from strata_core.api.lora import LoraAdapters
from strata_core.api.metrics import Metrics
from strata_core.api.prompts import ChatPrompts, tool_setup
from strata_core.api.sampling_defaults import resolve_seed
from strata_core.api.stream import timed_out
from strata_core.api.tracing import trace_request
from strata_core.client.reader import EngineClient, EngineUnavailable, RequestStream
from strata_core.contract import protocol as proto
from strata_core.contract.events import Finished, TokenEvent, Usage
from strata_core.contract.options import GenOptions
from strata_core.ops.config import CPU_PARALLEL, Config
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import BaseRequest, ChatRequest
from strata_core.text.chat import ChatTemplate
from strata_core.text.choice import ChatShape, ChoiceText, Delta, carry
from strata_core.text.infill import EditorLimits
from strata_core.text.structured import Constraint

log = logging.getLogger("strata.service")
T = TypeVar("T")


async def service_for(request: Request, model: str | None) -> Service:
    """The Service of the model a request names (loaded now if it is not), from the app's
    ModelPool (create_app puts it in the app's state); 404 for a model not served."""
    return await request.app.state.pool.service(model)  # type: ignore[no-any-return]


async def json_body(request: Request) -> Any:
    """The request's JSON body, within the operator's size and nesting limits ([server];
    create_app puts them in the app's state), before any model is picked."""
    return await read_json(request, request.app.state.server_config)


async def until_done(request: Request, work: Awaitable[T], timeout: float | None) -> T:
    """Run ``work``; cancel it (and so its engine requests) when the client goes away (499)
    or after ``timeout`` seconds (504). Whatever ends, both tasks are awaited."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({task, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        finished = task.done()
        for t in (task, gone):
            t.cancel()
        await asyncio.gather(task, gone, return_exceptions=True)
    if finished:
        return task.result()
    if gone.done() and not gone.cancelled():
        raise ApiError(499, "client closed the request", code="client_closed")
    raise timed_out(timeout)


async def engine_work(request: Request, service: Service, work: Awaitable[T]) -> T:
    """``work`` (requests to the engine that are not GEN: EMBED) under the request timeout;
    503 if the engine fails, counted."""
    try:
        return await until_done(request, work, service.config.server.request_timeout or None)
    except EngineUnavailable as exc:
        service.metrics.errors.inc()
        raise engine_unavailable(exc) from None


async def disconnected(request: Request) -> None:
    """Return when the client hangs up. The body has been read, so the server's next
    message is the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def engine_unavailable(why: object) -> ApiError:
    return ApiError(503, f"the engine is unavailable: {why}", type="server_error", code="engine_unavailable")


@dataclass(frozen=True)
class Names:
    """An API family's names, for errors: of the prompt (``messages``, ``input``,
    ``prompt`` ...), of the token limit (None: the request's own) and of the reply's format."""

    prompt: str
    limit: str | None = None
    format: str = "response_format"


@dataclass
class Run:
    """Every started choice of one request (``n`` per prompt, in order), the seed it was
    given and the reply's JSON constraint (None: free text)."""

    choices: list[AsyncIterator[Delta]]
    seed: int
    constraint: Constraint | None


def seed_for_choice(seed: int, i: int) -> int:
    """Distinct, reproducible seeds for the n choices of one request."""
    if i == 0:
        return seed
    x = (seed + 0x9E3779B97F4A7C15 * i) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


@dataclass
class ChatRun:
    """One started chat choice: its pieces, the prompt's length, the seed it was given and
    the response_format's constraint (None: free text)."""

    pieces: AsyncIterator[Delta]
    prompt_tokens: int
    seed: int
    constraint: Constraint | None


@dataclass
class Service:
    config: Config
    model_id: str
    engine: EngineClient
    backend_info: dict[str, Any] = field(default_factory=dict)
    pieces: list[bytes] = field(default_factory=list)
    template: ChatTemplate | None = None
    #: the operator's chat template ([engine] chat_template), over the GGUF's
    chat_template: str | None = None
    metrics: Metrics = field(init=False)
    #: engine requests admitted (admission) and not sent yet
    admitting: int = field(default=0, init=False)
    #: the engine options of a choice (choice_options.py)
    choice_options: ChoiceOptions = field(init=False)
    #: the grammars of forced tool calls (constraints.py)
    tool_grammars: ToolGrammars = field(init=False)
    #: its LoRA adapters by name (lora.py)
    adapters: LoraAdapters = field(init=False)

    def __post_init__(self) -> None:
        self.adapters = LoraAdapters(self.engine, self.config.engine.lora)
        self.choice_options = ChoiceOptions(self.engine, self.config, self.adapters)
        self.tool_grammars = ToolGrammars(self.engine, self.config)
        self.metrics = Metrics(
            queue_depth=lambda: max(0, self.engine.in_flight - self.slots),
            busy_slots=lambda: min(self.engine.in_flight, self.slots),
            cancelled=lambda: self.engine.done_reasons["cancelled"],
            kv_usage=self.engine.kv_usage,
            model_name=self.model_id,
            kv_cells=self.engine.kv_cells,
            lora_names=lambda: {a["id"]: a["name"] for a in self.adapters.listing()},
            lora_in_flight=self.engine.lora_in_flight,
        )

    async def prepare(self) -> None:
        """Learn the vocabulary and chat template once the engine is ready."""
        await self.engine.wait_ready()
        info = self.engine.info
        self.pieces = await self.engine.vocab()
        source = self.chat_template or info.get("chat_template")
        if source:  # none: chat requests are refused (chat_prompt), completions still run
            self.template = ChatTemplate(source, bos_token=info.get("bos_text", ""), eos_token=info.get("eos_text", ""))
            if self.template.tool_problem:  # said once, as the model loads
                origin = "its chat_template file" if self.chat_template else "the GGUF's chat template"
                then = "tools use the generic format" if self.config.tools.generic else "requests with tools are refused"
                log.warning("%s: %s renders tool calls in no shape a format can be derived from (%s): %s",
                            self.model_id, origin, self.template.tool_problem, then)  # fmt: skip

    @property
    def slots(self) -> int:
        """The engine's slots: what it reported ready with (``parallel = "auto"`` sizes
        them there), else the configuration's number, else the CPU default."""
        if "slots" in self.engine.info:
            return int(self.engine.info["slots"])
        parallel = self.config.engine.parallel
        return parallel if isinstance(parallel, int) else CPU_PARALLEL

    def kv_summary(self) -> str:
        """The KV cache as the start-up line reports it: types, and memory per slot."""
        info = self.engine.info
        kv = info.get("kv_cache")
        if not kv:
            return ""
        return (f"KV cache {kv['type_k']}/{kv['type_v']}: {kv['bytes_per_slot'] / (1 << 20):.1f} MiB per slot "
                f"({info.get('slots')} slots of {info.get('n_ctx')} tokens)")  # fmt: skip

    @property
    def n_ctx(self) -> int:
        return int(self.engine.info["n_ctx"])

    @property
    def inputs(self) -> list[str]:
        """What the model takes: text, and image or audio when its projector encodes them."""
        return list(self.engine.info.get("inputs") or ["text"])

    @property
    def n_vocab(self) -> int:
        return int(self.engine.info["n_vocab"])

    # ---- checks every request passes ------------------------------------------------------

    def ready(self) -> None:
        """503 while the engine (re)starts."""
        if not self.engine.ready.is_set():
            raise ApiError(503, "the engine is starting; try again shortly", type="server_error",
                           code="engine_unavailable")  # fmt: skip

    @contextmanager
    def admission(self, choices: int) -> Iterator[None]:
        """Room for ``choices`` engine requests until they are sent (GEN), or 429 when more
        than ``[server] max_queued`` would wait for a slot; a request that could never fit
        is a 400."""
        limit, slots = self.config.server.max_queued, self.slots
        if limit and choices > limit + slots:
            raise ApiError(400, f"the request asks for {choices} choices (n for each prompt); this server "
                           f"runs {slots} at once and queues at most {limit}", param="n",
                           code="invalid_value")  # fmt: skip
        waiting = self.engine.in_flight + self.admitting - slots
        if limit and waiting + choices > limit:
            self.metrics.refused.inc()
            raise queue_full(max(0, waiting), limit)
        self.admitting += choices
        try:
            yield
        finally:
            self.admitting -= choices

    def check_token_ids(self, ids: list[int], param: str) -> None:
        bad = [t for t in ids if t >= self.n_vocab]
        if bad:
            raise ApiError(400, f"{param} holds token id {bad[0]}, outside the vocabulary (token ids are "
                           f"0..{self.n_vocab - 1})", param=param, code="invalid_value")  # fmt: skip

    # ---- prompts --------------------------------------------------------------------------

    async def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        """``text``'s token ids (``special``: special tokens' text as those tokens), with
        the model's BOS first when it wants one and ``add_bos``."""
        ids = await self.engine.tokenize(text, special=special)
        bos = self.engine.info.get("bos")
        if add_bos and self.engine.info.get("add_bos") and bos is not None and (not ids or ids[0] != bos):
            ids.insert(0, bos)
        return ids

    async def chat_prompt(self, req: ChatRequest) -> tuple[list[int], ChatShape]:
        """The prompt's token ids, and how the reply will be cut up (prompts.ChatPrompts)."""
        return await ChatPrompts(self.engine, self.config, self.model_id, self.template).render(req)

    async def tool_grammar(self, req: ChatRequest, shape: ChatShape, format_param: str) -> str | None:
        """The grammar of the tool calls ``req`` forces (constraints.ToolGrammars), or None."""
        return await self.tool_grammars.grammar(req, shape, tool_setup(self.template, self.config), format_param)

    # ---- a run of choices -----------------------------------------------------------------

    async def start_run(
        self,
        req: BaseRequest,
        prompts: list[list[int]],
        names: Names,
        shape: ChatShape | None = None,
        tool_grammar: str | None = None,
        echoes: list[str] | None = None,
        limits: Callable[[], EditorLimits] | None = None,
    ) -> Run:
        """Every choice of ``req`` (``n`` per prompt) started, for every API family: the
        reply's constraint, the seed, each prompt's token limit, each choice's options.
        ``shape``: a chat's (None: a completion); ``tool_grammar``: a forced tool call's;
        ``echoes``: text shown before each prompt's choices (completions' ``echo``);
        ``limits``: makes each choice's editor stops (``/infill``'s)."""
        grammar, constraint, grammar_param = constrain(req, tool_grammar, names.format)
        seed = resolve_seed(req.seed)
        max_new = [self.choice_options.check_lengths(p, req, names.prompt, names.limit) for p in prompts]
        think = await self.choice_options.think_budget(req, shape)
        stops = req.stop_list()
        choices = []
        for pi, prompt in enumerate(prompts):
            for j in range(req.n):
                opts = self.choice_options.build(req, seed=seed_for_choice(seed, pi * req.n + j),
                                                 max_tokens=max_new[pi], grammar=grammar).replace(**think)  # fmt: skip
                echo = echoes[pi] if echoes else ""
                lim = limits() if limits is not None else None
                choices.append(self.start_choice(prompt, opts, stops, echo, shape, grammar_param, lim))
        return Run(choices, seed, constraint)

    async def start_chat(self, req: ChatRequest, names: Names) -> ChatRun:
        """The one choice of a chat request started, for the API families that answer with
        one choice (Responses, Messages, Ollama); ``names`` are their names of the
        conversation, the token limit and the reply's format, for errors."""
        self.ready()
        prompt, shape = await self.chat_prompt(req)
        run = await self.start_run(req, [prompt], names, shape, await self.tool_grammar(req, shape, names.format))
        return ChatRun(run.choices[0], len(prompt), run.seed, run.constraint)

    # ---- one choice -----------------------------------------------------------------------

    def start_choice(
        self,
        prompt: list[int],
        options: GenOptions,
        stops: list[str],
        echo: str = "",
        shape: ChatShape | None = None,
        grammar_param: str | None = None,
        limits: EditorLimits | None = None,
    ) -> AsyncIterator[Delta]:
        """Send GEN now (so an unavailable engine fails before the first byte); the choice's
        pieces as they come.

        ``echo``: text shown before the generated text (completions' ``echo``);
        ``shape``: a chat reply's reasoning / tool-call split (None: plain text);
        ``grammar_param``: the parameter the grammar came from, named if the engine refuses it;
        ``limits``: the editor stops (``/infill``'s n_indent, t_max_predict_ms), if any.
        """
        try:
            stream = self.engine.generate(prompt, options)
        except EngineUnavailable as exc:
            raise engine_unavailable(exc) from None
        self.metrics.requests.inc()
        choice = ChoiceText(self.pieces, stops, options.logprobs, shape, limits)
        return self._follow(stream, choice, echo, grammar_param)

    async def _follow(
        self, stream: RequestStream, choice: ChoiceText, echo: str, grammar_param: str | None
    ) -> AsyncIterator[Delta]:
        t0 = time.perf_counter()
        last = t0
        # entries released with no text (a stop, a think tag): sent with the next piece
        carried = Delta("")
        try:
            if echo:
                yield Delta(echo)
            async for batch in stream.events():
                end = batch[-1] if isinstance(batch[-1], Finished) else None
                evs = [ev for ev in batch if isinstance(ev, TokenEvent)]
                if evs:
                    now = time.perf_counter()
                    (self.metrics.itl if last != t0 else self.metrics.ttft).observe(now - last)
                    for _ in evs[1:]:  # tokens that arrived with it
                        self.metrics.itl.observe(0.0)
                    last = now
                if evs and not choice.stopped:
                    piece = carry(carried, choice.push(*evs))
                    if choice.stopped:
                        self.engine.cancel(stream.rid)
                    if piece.shows():
                        carried = Delta("")
                        yield piece
                    else:
                        carried = piece
                if end is not None:
                    tail = self._last_piece(end, choice, carried, grammar_param)
                    trace_request(self.model_id, stream.rid, t0, tail.finish or "stop", tail.usage or Usage(), end.stats)
                    yield tail
                    return
        finally:
            if not stream.finished:
                self.engine.cancel(stream.rid)

    def _last_piece(self, ev: Finished, choice: ChoiceText, carried: Delta, grammar_param: str | None) -> Delta:
        """The choice's last piece once the engine is done: the rest of its text, the
        finish reason and the usage."""
        if ev.error is not None and ev.error.startswith(proto.GRAMMAR_REFUSED):
            raise grammar_refused(ev.error, grammar_param)
        if ev.error is not None or ev.reason == "error":
            self.metrics.errors.inc()
            raise EngineUnavailable(ev.error or "the engine failed the request")
        usage = Usage.from_stats(ev.stats)
        self.metrics.spec_drafted.inc(usage.drafted)
        self.metrics.spec_accepted.inc(usage.accepted)
        self.metrics.prompt_tokens.inc(usage.prompt)
        self.metrics.cached_tokens.inc(usage.cached)
        self.metrics.gen_tokens.inc(usage.completion)
        tail = carry(carried, choice.end())
        finish = "stop" if choice.stopped or ev.reason != "length" else "length"
        self.metrics.finished(finish)
        tail.tool_calls = choice.tool_calls
        tail.stop_sequence = choice.stop_sequence
        if finish == "stop" and tail.tool_calls:
            finish = "tool_calls"
        usage.reasoning = choice.reasoning_tokens
        tail.finish, tail.usage = finish, usage
        return tail
