"""The request path every API shares (docs/architecture.md, "One request's path"): the
engine's vocabulary and chat template, prompts, the engine options of one choice, and
one choice followed from GEN to its last piece. An API family's module (completions.py)
turns its request into these calls and their pieces into its bodies."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from fastapi import Request

from strata_core.api.limits import queue_full, read_json
from strata_core.api.media import check_media, media_marker, media_prompt
from strata_core.api.metrics import Metrics
from strata_core.api.sampling_defaults import (
    REQUEST_PARAMS,
    gen_options,
    max_new_tokens,
    resolve_seed,
)
from strata_core.api.stream import timed_out
from strata_core.client.reader import EngineClient, EngineUnavailable, RequestStream
from strata_core.contract import protocol as proto
from strata_core.contract.events import Finished, TokenEvent, Usage
from strata_core.contract.options import GenOptions, OptionError
from strata_core.ops.config import CPU_PARALLEL, Config
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import BaseRequest, ChatRequest, Tool
from strata_core.text.chat import ChatTemplate, TemplateError
from strata_core.text.choice import ChatShape, ChoiceText, Delta, carry
from strata_core.text.constraints import request_constraint
from strata_core.text.generic_tools import generic_grammar, generic_instruction, generic_messages
from strata_core.text.grammars import grammar_error, json_schema_grammar, llguidance_grammar
from strata_core.text.reasoning import prompt_opens_think
from strata_core.text.structured import Constraint
from strata_core.text.tool_formats import MAX_CALLS, ToolFormat, example_call
from strata_core.text.tool_setup import ToolSetup
from strata_core.text.tools import Dialect

T = TypeVar("T")
#: What a spent reasoning budget makes the engine write: the marker, and the blank line
#: that separates reasoning from answer in the thinking templates.


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


def check_parameters(tool: Tool) -> None:
    """400 naming the tool when its ``parameters`` schema admits no value: checked alone,
    since inside a call grammar its emptiness shows only once the call's text has begun."""
    params = tool.function.parameters
    if params is None:
        return
    try:
        problem = grammar_error(json_schema_grammar(params, lenient=not tool.function.strict))
    except ValueError as exc:
        problem = str(exc)
    if problem:
        raise ApiError(400, f"the parameters of tool {tool.function.name!r} cannot be enforced: {problem}",
                       param="tools", code="invalid_value")  # fmt: skip


def grammar_refused(message: str, param: str | None) -> ApiError:
    """The answer to an engine's ERR saying llguidance refused the request's grammar: the
    caller's constraint, so a 400 (its short reason; the engine's log has the rest)."""
    reason = message.removeprefix(proto.GRAMMAR_REFUSED).strip()
    where = f"'{param}'" if param else "the request's constraint"
    return ApiError(400, f"{where} cannot be enforced: {reason}", param=param, code="invalid_value")


def engine_unavailable(why: object) -> ApiError:
    return ApiError(503, f"the engine is unavailable: {why}", type="server_error", code="engine_unavailable")


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
    #: the closing marker a reasoning budget makes the engine write (tokenized once)
    #: a closing reasoning marker's token ids, by its text
    _think_close: dict[str, tuple[int, ...]] = field(default_factory=dict, init=False)
    #: the tokens of a tool's example call in the family's format, by its text (calls_that_fit)
    _call_costs: dict[str, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self.metrics = Metrics(
            queue_depth=lambda: max(0, self.engine.in_flight - self.slots),
            busy_slots=lambda: min(self.engine.in_flight, self.slots),
            cancelled=lambda: self.engine.done_reasons["cancelled"],
            kv_usage=self.engine.kv_usage,
            model_name=self.model_id,
        )

    async def prepare(self) -> None:
        """Learn the vocabulary and chat template once the engine is ready."""
        await self.engine.wait_ready()
        info = self.engine.info
        self.pieces = await self.engine.vocab()
        source = self.chat_template or info.get("chat_template")
        if source:  # none: chat requests are refused (chat_prompt), completions still run
            self.template = ChatTemplate(source, bos_token=info.get("bos_text", ""), eos_token=info.get("eos_text", ""))

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

    def lora_scales(self, req: BaseRequest) -> dict[int, float]:
        """A request's ``lora`` as adapter id -> scale; 400 for an adapter the model lacks."""
        n = len(self.engine.info.get("lora") or [])
        scales: dict[int, float] = {}
        for entry in req.lora or ():
            if entry.id >= n:
                raise ApiError(400, f"lora names adapter {entry.id}, but this model has {n} (GET /lora-adapters "
                               "lists them)", param="lora", code="invalid_value")  # fmt: skip
            scales[entry.id] = entry.scale
        return scales

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

    @property
    def tool_setup(self) -> ToolSetup | Dialect | None:
        """How the model calls tools: its template's family format and history shape, else
        (``[tools] generic``) the generic format the server shows it; None: it cannot."""
        setup = self.template.tool_setup if self.template is not None else None
        if setup is None and self.config.tools.generic:
            return Dialect.GENERIC
        return setup

    async def chat_prompt(self, req: ChatRequest) -> tuple[list[int], ChatShape]:
        """The prompt's token ids, and how the reply will be cut up."""
        if self.template is None:
            raise ApiError(400, f"the model {self.model_id!r} has no chat template (its GGUF carries none and the "
                           "server configures none): use the completions API, or have the operator set "
                           "chat_template = \"FILE.jinja\" for it", param="messages",
                           code="no_chat_template")  # fmt: skip
        setup = self.tool_setup
        if req.tools and setup is None:
            raise ApiError(
                400,
                "this model's chat template does not support tools (it never reads them), "
                "so the model would not see them, and this server's generic tool format is "
                "off ([tools] generic = false); leave tools out",
                param="tools",
                code="unsupported_value",
            )
        mode = req.tool_mode()
        tools = None if mode == "none" else [t.template_view() for t in req.tools or ()]
        media = req.media()
        if media:
            check_media(media, self.inputs, self.config.server)
        marker = media_marker() if media else None
        messages = [m.template_view(marker) for m in req.messages]
        if setup is Dialect.GENERIC:  # the template reads neither tools nor tool messages
            named = req.forced_tools()[0].function.name if mode == "named" else None
            parallel = req.parallel_tool_calls is not False
            instruction = None if tools is None else generic_instruction(tools, mode, parallel, named)
            messages, tools = generic_messages(messages, instruction), None
        elif isinstance(setup, ToolSetup):
            messages, tools = setup.messages(messages), setup.tools(tools)
        try:
            text = self.template.render(
                messages, add_generation_prompt=True, tools=tools, **(req.chat_template_kwargs or {})
            )
        except TemplateError as exc:
            raise ApiError(400, f"the chat template failed: {exc}", param="messages") from None
        shape = self.chat_shape(req, text, mode)
        if marker is not None:
            return await media_prompt(self.engine, text, marker, media, self.config.server), shape
        return await self.engine.tokenize(text, special=True), shape

    def chat_shape(self, req: ChatRequest, prompt: str, mode: str) -> ChatShape:
        """How a reply to ``prompt`` is cut up: reasoning in the family's tags, tool calls in
        its format (none when tool_choice is none)."""
        setup = self.tool_setup
        if not isinstance(setup, ToolSetup):
            think = prompt_opens_think(prompt)
            return ChatShape(think, None if mode == "none" or setup is None else setup, most_calls=req.max_tool_calls)
        fmt = setup.format
        tools = tuple(t.template_view() for t in req.tools or ())
        thinking = prompt_opens_think(prompt, fmt.think)
        reads: ToolFormat | None = fmt
        if mode == "none":  # no calls read; a family's content channel still opens with markup
            reads = fmt.content_only() if fmt.lead else None
        return ChatShape(thinking, format=reads, think=fmt.think, tools=tools, new_id=setup.new_id,
                         most_calls=req.max_tool_calls)  # fmt: skip

    async def tool_grammar(
        self, req: ChatRequest, shape: ChatShape, format_param: str = "response_format"
    ) -> str | None:
        """The grammar option of a request with tools: forcing a call for tool_choice
        required / named, in the family's own syntax; in the generic format also for auto
        (a response or calls). ``shape``: the prompt's (whether it left reasoning open).
        ``format_param``: the family's name of response_format, for errors."""
        mode = req.tool_mode()
        setup = self.tool_setup
        generic = setup is Dialect.GENERIC
        if mode == "none" or (mode == "auto" and not generic):
            return None
        assert setup is not None  # chat_prompt refused tools without one
        if generic and mode == "auto" and req.response_format is not None and req.response_format.type != "text":
            raise ApiError(
                400,
                "on this model tools use the generic format, whose grammar constrains the reply "
                f"as {format_param} would; send one of them (or tool_choice 'none')",
                param=format_param,
                code="unsupported_value",
            )
        if "grammar" not in self.engine.info.get("capabilities", ()):
            if mode == "auto":  # unconstrained: the parser still reads what the model writes
                return None
            raise ApiError(
                400,
                f"tool_choice {mode!r} needs constrained decoding, which this engine does not "
                "offer (no 'grammar' capability); send tool_choice 'auto'",
                param="tool_choice",
                code="unsupported_value",
            )
        for tool in req.forced_tools():
            check_parameters(tool)
        tools = [t.template_view() for t in req.forced_tools()]
        parallel = req.parallel_tool_calls is not False and req.max_tool_calls != 1
        if isinstance(setup, ToolSetup):
            most = await self.calls_that_fit(setup.format, tools, max_new_tokens(req, self.config.sampling))
            most = min(most, req.max_tool_calls or most)
            grammar = setup.format.grammar(tools, parallel=parallel, close_think=shape.thinking, most=most)
        else:
            grammar = generic_grammar(tools, parallel, text=mode == "auto")
        problem = grammar_error(llguidance_grammar("lark", grammar))
        if problem:
            raise ApiError(400, f"the tools' parameters cannot be enforced: {problem}", param="tools",
                           code="invalid_value")  # fmt: skip
        return proto.encode_grammar("lark", grammar)

    async def calls_that_fit(self, fmt: ToolFormat, tools: list[dict[str, Any]], budget: int | None) -> int:
        """How many calls a forced turn may make in ``budget`` tokens: each counted as its
        dearest tool's call costs, markers and short values included (a small model that
        starts a call it has no room for ends at max_tokens, mid-call). At least one."""
        if budget is None:
            return MAX_CALLS
        costs = []
        for tool in tools:
            text = fmt.write([example_call(tool)], {})
            if text not in self._call_costs:
                if len(self._call_costs) >= 1024:  # every request may bring tools of its own
                    self._call_costs.clear()
                self._call_costs[text] = len(await self.tokenize(text, add_bos=False))
            costs.append(self._call_costs[text])
        return max(1, budget // max(costs, default=1))

    def check_lengths(
        self, prompt: list[int], req: BaseRequest, param: str, limit_param: str | None = None
    ) -> int:
        """The max_tokens to send; 400 when the prompt or the request exceed the context.
        ``param`` names the prompt, ``limit_param`` the token limit (else the request's own)."""
        n_ctx, n = self.n_ctx, len(prompt)
        if n >= n_ctx:
            raise ApiError(
                400,
                f"the prompt has {n} tokens but the model's context holds {n_ctx}",
                param=param,
                code="context_length_exceeded",
            )
        max_new = max_new_tokens(req, self.config.sampling)
        if max_new is not None and n + max_new > n_ctx:
            name = limit_param or (
                "max_completion_tokens" if getattr(req, "max_completion_tokens", None) else "max_tokens"
            )
            raise ApiError(
                400,
                f"{name} = {max_new} does not fit: the prompt has {n} tokens and the "
                f"context holds {n_ctx}, leaving {n_ctx - n}",
                param=name,
                code="context_length_exceeded",
            )
        return max_new if max_new is not None else n_ctx - n

    def constrain(
        self, req: BaseRequest, grammar: str | None, format_param: str = "response_format"
    ) -> tuple[str | None, Constraint | None, str | None]:
        """The grammar option of a choice, its JSON constraint (to reconcile the answer with)
        and the parameter the grammar came from: a forced tool call's ``grammar`` (``tools``),
        or the request's response_format (``format_param``), structured_outputs or grammar."""
        asked = request_constraint(req, format_param)
        if grammar is not None:
            if asked is not None:
                raise ApiError(400, f"the tool call this request forces and {asked.param} both constrain the "
                               "reply; send one", param=asked.param, code="unsupported_value")  # fmt: skip
            return grammar, None, "tools"
        if asked is not None:
            return asked.gen_value, asked.json, asked.param
        return None, None, None

    async def think_budget(self, req: BaseRequest, shape: ChatShape | None) -> dict[str, Any]:
        """The GenOptions fields of a chat's ``reasoning_budget`` (none without one): the
        budget, the closing marker's ids and whether the prompt opened the reasoning."""
        budget = getattr(req, "reasoning_budget", None)
        if budget is None or shape is None:
            return {}
        if "think_budget" not in self.engine.info.get("capabilities", ()):
            raise ApiError(400, "this engine cannot bound reasoning (no 'think_budget' capability); leave "
                           "reasoning_budget out", param="reasoning_budget", code="unsupported_value")  # fmt: skip
        close = f"\n{shape.think[1]}\n\n"  # the family's closing marker (text/tool_formats.py)
        if close not in self._think_close:
            self._think_close[close] = tuple(await self.engine.tokenize(close, special=True))
        return {"think_budget": budget, "think_close": self._think_close[close], "think_open": shape.thinking}

    async def start_chat(
        self, req: ChatRequest, param: str, limit_param: str, format_param: str = "response_format"
    ) -> ChatRun:
        """The one choice of a chat request started, for the API families that answer with
        one choice (Responses, Messages); ``param`` / ``limit_param`` / ``format_param`` are
        their names of the conversation, the token limit and the reply's format, for errors."""
        self.ready()
        prompt, shape = await self.chat_prompt(req)
        tool_grammar = await self.tool_grammar(req, shape, format_param)
        grammar, constraint, grammar_param = self.constrain(req, tool_grammar, format_param)
        seed = resolve_seed(req.seed)
        max_new = self.check_lengths(prompt, req, param, limit_param)
        opts = self.options(req, seed=seed, max_tokens=max_new, grammar=grammar)
        opts = opts.replace(**await self.think_budget(req, shape))
        pieces = self.start_choice(prompt, opts, req.stop_list(), shape=shape, grammar_param=grammar_param)
        return ChatRun(pieces, len(prompt), seed, constraint)

    # ---- one choice -----------------------------------------------------------------------

    def options(self, req: BaseRequest, *, seed: int, max_tokens: int, grammar: str | None) -> GenOptions:
        """The engine options of one choice: the request's sampling and logprobs, the
        operator's defaults, and how the engine runs it (alone for an exact seeded replay,
        or with speculative windows)."""
        cfg = self.config
        opts = gen_options(req, cfg.sampling, seed=seed, max_tokens=max_tokens)
        if req.seed is not None and cfg.sampling.exact_seed_replay:
            opts = opts.replace(isolate=True)
        elif cfg.speculative.mode != "off" and req.speculative is not False:
            opts = opts.replace(spec=cfg.speculative.mode)
        if grammar is not None:
            opts = opts.replace(grammar=grammar)
        if req.lora is not None:
            opts = opts.replace(lora=self.lora_scales(req))
        if req.ignore_eos:  # an end-of-generation token's logit is -inf, as llama-server sets it
            eog = dict.fromkeys(self.engine.info.get("eog") or [], -math.inf)
            opts = opts.replace(sampling=replace(opts.sampling, bias={**opts.sampling.bias, **eog}))
        try:
            opts.check(self.n_vocab)
        except OptionError as exc:
            param = REQUEST_PARAMS.get(exc.key, exc.key)
            raise ApiError(400, f"invalid {param}: {exc}", param=param, code="invalid_value") from None
        return opts

    def start_choice(
        self,
        prompt: list[int],
        options: GenOptions,
        stops: list[str],
        echo: str = "",
        shape: ChatShape | None = None,
        grammar_param: str | None = None,
    ) -> AsyncIterator[Delta]:
        """Send GEN now (so an unavailable engine fails before the first byte); the choice's
        pieces as they come.

        ``echo``: text shown before the generated text (completions' ``echo``);
        ``shape``: a chat reply's reasoning / tool-call split (None: plain text);
        ``grammar_param``: the parameter the grammar came from, named if the engine refuses it.
        """
        try:
            stream = self.engine.generate(prompt, options)
        except EngineUnavailable as exc:
            raise engine_unavailable(exc) from None
        self.metrics.requests.inc()
        choice = ChoiceText(self.pieces, stops, options.logprobs, shape)
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
                    yield self._last_piece(end, choice, carried, grammar_param)
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
