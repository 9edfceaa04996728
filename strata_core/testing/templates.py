"""The chat templates of the pinned llama.cpp source that read ``tools``: the corpus the
tool-call tests and ``python -m bench.tool_formats`` run over, with the tools and the assistant
turn they render."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from strata_core.ops.build import source_dir
from strata_core.text.tool_setup import PROBE_TOOL

#: the probe call's tool: the corpus renders the call the format was found by
WEATHER: dict[str, Any] = copy.deepcopy(PROBE_TOOL)
TIME: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "The time in a zone",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "description": "the zone"}},
            "required": ["zone"],
        },
    },
}
TOOLS = [WEATHER, TIME]
CALLS: list[tuple[str, dict[str, Any]]] = [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"zone": "UTC"})]


def corpus_dir() -> Path:
    return source_dir(lambda *_: None) / "vendor" / "llama.cpp" / "models" / "templates"


def tool_templates() -> list[str]:
    """File names of the corpus's templates that read ``tools``."""
    return sorted(p.name for p in corpus_dir().glob("*.jinja") if re.search(r"\btools\b", p.read_text()))


def template_source(name: str) -> str:
    return (corpus_dir() / name).read_text()


def assistant_turn(calls: list[tuple[str, dict[str, Any]]], ids: list[str]) -> dict[str, Any]:
    """An assistant message (template view) making ``calls`` with ``ids``."""
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in zip(ids, calls, strict=True)
        ],
    }
