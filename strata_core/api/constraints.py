"""What constrains a reply: the request's own constraint (response_format,
structured_outputs, grammar) or the grammar of a tool call it forces, in the model's
family's syntax; and the 400s when one cannot be enforced."""

from __future__ import annotations

from typing import Any

from strata_core.api.sampling_defaults import max_new_tokens
from strata_core.client.reader import EngineClient
from strata_core.contract import protocol as proto
from strata_core.ops.config import Config
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import BaseRequest, ChatRequest, Tool
from strata_core.text.choice import ChatShape
from strata_core.text.constraints import request_constraint
from strata_core.text.grammars import grammar_error, json_schema_grammar, llguidance_grammar
from strata_core.text.structured import Constraint
from strata_core.text.tool_formats import MAX_CALLS, ToolFormat, example_call
from strata_core.text.tool_setup import ToolSetup


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


def constrain(
    req: BaseRequest, grammar: str | None, format_param: str = "response_format"
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


class ToolGrammars:
    """The grammar of a request's tool calls, for the engine it runs on (whose tokens
    measure how many calls fit the reply's budget)."""

    def __init__(self, engine: EngineClient, config: Config) -> None:
        self.engine, self.config = engine, config
        #: the tokens of a tool's example call in the family's format, by its text (calls_that_fit)
        self._call_costs: dict[str, int] = {}

    async def grammar(
        self, req: ChatRequest, shape: ChatShape, setup: ToolSetup | None, format_param: str
    ) -> str | None:
        """The grammar option of a request with tools: forcing a call for tool_choice
        required / named, in the family's own syntax; in the generic format also for auto
        (a response or calls). ``shape``: the prompt's (whether it left reasoning open);
        ``setup``: how the model calls tools; ``format_param``: the family's name of
        response_format, for errors."""
        mode = req.tool_mode()
        answers = setup is not None and setup.format.answers
        if mode == "none" or (mode == "auto" and not answers):
            return None
        assert setup is not None  # the prompt refused tools without one
        if answers and mode == "auto" and req.response_format is not None and req.response_format.type != "text":
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
        tools = req.forced_views()
        parallel = req.parallel_tool_calls is not False and req.max_tool_calls != 1
        most = await self.calls_that_fit(setup.format, tools, max_new_tokens(req, self.config.sampling))
        most = min(most, req.max_tool_calls or most)
        grammar = setup.format.grammar(tools, parallel=parallel, close_think=shape.thinking, most=most, answer=mode == "auto")
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
                self._call_costs[text] = len(await self.engine.tokenize(text, special=True))
            costs.append(self._call_costs[text])
        return max(1, budget // max(costs, default=1))
