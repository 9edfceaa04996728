"""Chat templates that write tool calls in shapes no registered format lists: a handful
written by hand the way published templates of such families write them (Python calls,
a ``<function_call>`` block, a role-like header over a JSON list, action tags, a bare JSON
list), and a generator of synthetic ones from choices of those shapes (the derivation's
tests, tests/test_tool_derive.py)."""

from __future__ import annotations

from dataclasses import dataclass

# ---- by hand --------------------------------------------------------------------------------

_CHATML_TURNS = """
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|im_start|>@CALLER@
@CALLS@<|im_end|>
{% elif m.role == 'tool' %}<|im_start|>@RESULT@
{{ m.content }}<|im_end|>
{% else %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

_TOOLS_SYSTEM = """
{%- if tools %}<|im_start|>system
You can call functions. Their signatures:
{% for t in tools %}{{ t.function | tojson }}
{% endfor %}<|im_end|>
{% endif %}"""


def _chatml(calls: str, caller: str = "assistant", result: str = "tool") -> str:
    """ChatML with the tools in the system message: ``calls`` writes an assistant
    message's calls (after its content) under the role ``caller``; tool results come as
    ``result``."""
    content = "{{ m.content or '' }}" if caller == "assistant" else ""
    return _TOOLS_SYSTEM + _CHATML_TURNS.replace("@CALLS@", content + calls).replace("@CALLER@", caller).replace(
        "@RESULT@", result)


#: Llama 3.2's "pythonic" way: a Python list of calls as the whole reply, strings double-quoted
PYTHONIC = """{{- bos_token }}
{%- if tools %}<|start_header_id|>system<|end_header_id|>

You are an expert in composing functions. To call functions, reply only with
[func_name1(param1=value1, param2=value2), func_name2(...)]
Here is a list of functions in JSON format:
{% for t in tools %}{{ t | tojson(indent=2) }}
{% endfor %}<|eot_id|>
{%- endif %}
{%- for m in messages %}
{%- if m.role == 'assistant' and m.tool_calls %}<|start_header_id|>assistant<|end_header_id|>

[{% for c in m.tool_calls %}{% if not loop.first %}, {% endif %}{{ c.function.name }}(
{%- for k, v in c.function.arguments.items() %}{% if not loop.first %}, {% endif %}{{ k }}={{ v | tojson }}{% endfor %})
{%- endfor %}]<|eot_id|>
{%- elif m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- else %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{{ m.content }}<|eot_id|>
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"""

#: Salesforce xLAM's way: the calls as a bare JSON list, the whole reply
BARE_LIST = _chatml("""[{% for c in m.tool_calls %}{% if not loop.first %}, {% endif %}{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}{% endfor %}]""")

#: a ``<function_call>`` block per call, the arguments first and the keys sorted
FUNCTION_CALL_BLOCK = _chatml("""{% for c in m.tool_calls %}<function_call>{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson(sort_keys=true) }}</function_call>
{% endfor %}""")

#: the calls in a message of their own under a role-like header, a JSON list with "parameters"
ROLE_HEADER = _chatml("{{ m.tool_calls | map(attribute='function') | list | tojson }}", "tool/function_call", "tool/function_result")

#: InternLM-like action tags: a plugin call object between special tokens
ACTION_TAGS = _chatml("""{% for c in m.tool_calls %}<|action_start|><|plugin|>
{{ {'name': c.function.name, 'parameters': c.function.arguments} | tojson }}<|action_end|>
{% endfor %}""")

#: ReAct-style: the name after a label, the arguments as JSON after another
REACT = _chatml("""{% for c in m.tool_calls %}Action: {{ c.function.name }}
Action Input: {{ c.function.arguments | tojson }}
{% endfor %}""")

#: a Python call inside a tag, strings single-quoted as Python writes them
TAGGED_PYTHON = _chatml("""{% for c in m.tool_calls %}<tool>{{ c.function.name }}(
{%- for k, v in c.function.arguments.items() %}{% if not loop.first %}, {% endif %}{{ k }}={% if v is string %}'{{ v }}'{% else %}{{ v | tojson }}{% endif %}{% endfor %})</tool>
{% endfor %}""")

#: XML-ish parameters in a call tag naming the tool
XML_INVOKE = _chatml("""<calls>
{% for c in m.tool_calls %}<invoke tool="{{ c.function.name }}">
{% for k, v in c.function.arguments.items() %}<arg name="{{ k }}">{{ v if v is string else v | tojson }}</arg>
{% endfor %}</invoke>
{% endfor %}</calls>""")

#: special tokens around a JSON object holding the name, with a type and the call's id
TYPED_OBJECT = _chatml("""{% for c in m.tool_calls %}<|tool▁call|>{{ {'type': 'function', 'id': c.id, 'function_name': c.function.name, 'args': c.function.arguments} | tojson(separators=(',', ':')) }}<|tool▁call▁end|>{% endfor %}""")

#: writes a call as a sentence: nothing can be derived (the generic format serves it)
PROSE = _chatml("""{% for c in m.tool_calls %}I would use {{ c.function.name }} now.{% endfor %}""")

BY_HAND = {
    "pythonic": PYTHONIC, "bare-list": BARE_LIST, "function-call-block": FUNCTION_CALL_BLOCK,
    "role-header": ROLE_HEADER, "action-tags": ACTION_TAGS, "react": REACT, "tagged-python": TAGGED_PYTHON,
    "xml-invoke": XML_INVOKE, "typed-object": TYPED_OBJECT,
}  # fmt: skip

# ---- synthetic --------------------------------------------------------------------------------

#: markers a family may put around its calls (open, close)
MARKERS = (
    ("", ""), ("<tool_call>", "</tool_call>"), ("<|tool_calls|>", "<|/tool_calls|>"), ("[CALLS]", ""),
    ("<function_call>\n", "\n</function_call>"), ("<|action_start|><|plugin|>\n", "<|action_end|>"),
    ("tool/function_call\n", ""), ("<｜calls｜>", "<｜end｜>"),
)  # fmt: skip
NAME_KEYS = ("name", "tool_name", "function", "tool")
ARGS_KEYS = ("arguments", "parameters", "args", "input")
SEPARATORS = ((", ", ": "), (",", ":"))
#: what a family writes between the name and JSON arguments
MIDS = (" ", "\n", ":", "<|args|>", "\nAction Input: ", " with ")
#: XML-style parameters: (before the key, between key and value, after the value)
XML_PARAMS = (
    ('<parameter name="', '">', "</parameter>\n"), ("<arg_key>", "</arg_key><arg_value>", "</arg_value>"),
    ("<param=", ">\n", "\n</param>\n"),
)  # fmt: skip


@dataclass(frozen=True)
class Shape:
    """One way of writing calls: ``body`` json (an object holding name and arguments),
    python (``name(k=v)``), named (the name, ``mid``, JSON arguments) or xml; ``block``:
    one marker pair around all calls (``listed``: a bracketed list inside), else a pair
    around each."""

    body: str
    markers: tuple[str, str] = ("", "")
    block: bool = True
    listed: bool = False
    sep: str = "\n"
    name_key: str = "name"
    args_key: str = "arguments"
    args_first: bool = False
    typed: bool = False  # a constant "type": "function" member first
    separators: tuple[str, str] = (", ", ": ")
    sort_keys: bool = False
    quote: str = '"'  # python: how strings are quoted
    mid: str = " "  # named: between name and arguments
    xml: tuple[str, str, str] = XML_PARAMS[0]

    def call(self) -> str:
        """The Jinja that writes one call ``c``."""
        if self.body == "json":
            members = [f"'{self.name_key}': c.function.name", f"'{self.args_key}': c.function.arguments"]
            if self.args_first:
                members.reverse()
            if self.typed:
                members.insert(0, "'type': 'function'")
            seps = f"separators=('{self.separators[0]}', '{self.separators[1]}')"
            return "{{ {" + ", ".join(members) + "} | tojson(" + seps + (", sort_keys=true" if self.sort_keys else "") + ") }}"
        if self.body == "python":
            q = self.quote
            value = f"{{% if v is string %}}{q}{{{{ v }}}}{q}{{% else %}}{{{{ v | tojson }}}}{{% endif %}}"
            return ("{{ c.function.name }}({% for k, v in c.function.arguments.items() %}{% if not loop.first %}, {% endif %}"
                    "{{ k }}=" + value + "{% endfor %})")  # fmt: skip
        if self.body == "named":
            return "{{ c.function.name }}" + _jinja_text(self.mid) + "{{ c.function.arguments | tojson }}"
        before, between, after = (_jinja_text(x) for x in self.xml)
        return ('<call name="{{ c.function.name }}">\n{% for k, v in c.function.arguments.items() %}' + before + "{{ k }}" + between
                + "{{ v if v is string else v | tojson }}" + after + "{% endfor %}</call>")  # fmt: skip

    def calls(self) -> str:
        """The Jinja that writes an assistant message's calls."""
        op, cl = (_jinja_text(m) for m in self.markers)
        sep = _jinja_text(", " if self.listed else self.sep)
        each = f"{{% for c in m.tool_calls %}}{{% if not loop.first %}}{sep}{{% endif %}}"
        if self.block:
            lo, lc = ("[", "]") if self.listed else ("", "")
            return f"{op}{lo}{each}{self.call()}{{% endfor %}}{lc}{cl}"
        return f"{each}{op}{self.call()}{cl}{{% endfor %}}"

    def template(self) -> str:
        return _chatml(self.calls())


def _jinja_text(text: str) -> str:
    """``text`` as literal template text (no Jinja delimiters in it)."""
    return text.replace("{", "{{ '{' }}") if "{" in text else text
