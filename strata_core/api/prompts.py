"""A chat request as the prompt the engine runs: its messages and tools through the chat
template (in the way the model calls tools, or the generic format the server shows it),
media items tokenized in place, and how the reply will be cut up (text/choice.ChatShape)."""

from __future__ import annotations

from dataclasses import dataclass

from strata_core.api.media import check_media, media_marker, media_prompt
from strata_core.client.reader import EngineClient
from strata_core.ops.config import Config
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import ChatRequest
from strata_core.text.chat import ChatTemplate, TemplateError
from strata_core.text.choice import ChatShape
from strata_core.text.reasoning import prompt_opens_think
from strata_core.text.tool_formats import ToolFormat
from strata_core.text.tool_setup import GENERIC_SETUP, ToolSetup


def tool_setup(template: ChatTemplate | None, config: Config) -> ToolSetup | None:
    """How the model calls tools: its template's family format and history shape, else
    (``[tools] generic``) the generic format the server shows it; None: it cannot."""
    setup = template.tool_setup if template is not None else None
    if setup is None and config.tools.generic:
        return GENERIC_SETUP
    return setup


@dataclass
class ChatPrompts:
    engine: EngineClient
    config: Config
    model_id: str
    template: ChatTemplate | None

    @property
    def tool_setup(self) -> ToolSetup | None:
        return tool_setup(self.template, self.config)

    async def render(self, req: ChatRequest) -> tuple[list[int], ChatShape]:
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
        tools = None if mode == "none" else list(req.tool_views)
        media = req.media()
        if media:
            check_media(media, self.inputs, self.config.server)
        marker = media_marker() if media else None
        messages = [m.template_view(marker) for m in req.messages]
        if setup is not None:
            named = req.forced_tools()[0].function.name if mode == "named" else None
            messages, tools = setup.prompt(messages, tools, mode, req.parallel_tool_calls is not False, named)
        try:
            text = self.template.render(
                messages, add_generation_prompt=True, tools=tools, **(req.chat_template_kwargs or {})
            )
        except TemplateError as exc:
            raise ApiError(400, f"the chat template failed: {exc}", param="messages") from None
        shape = self.shape(req, text, mode)
        if marker is not None:
            return await media_prompt(self.engine, text, marker, media, self.config.server), shape
        return await self.engine.tokenize(text, special=True), shape

    @property
    def inputs(self) -> list[str]:
        """What the model takes: text, and image or audio when its projector encodes them."""
        return list(self.engine.info.get("inputs") or ["text"])

    def shape(self, req: ChatRequest, prompt: str, mode: str) -> ChatShape:
        """How a reply to ``prompt`` is cut up: reasoning in the family's tags, tool calls in
        its format (none when tool_choice is none), at most ``max_tool_calls`` of them."""
        setup = self.tool_setup
        if setup is None:
            return ChatShape(prompt_opens_think(prompt), most_calls=req.max_tool_calls)
        fmt = setup.format
        thinking = prompt_opens_think(prompt, fmt.think)
        reads: ToolFormat | None = fmt
        if mode == "none":  # no calls read; a family's content channel still opens with markup
            reads = fmt.content_only() if fmt.lead else None
        return ChatShape(thinking, format=reads, think=fmt.think, tools=req.tool_views, new_id=setup.new_id,
                         most_calls=req.max_tool_calls)  # fmt: skip
