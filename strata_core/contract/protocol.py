"""Engine protocol, version 1: turn commands and events into lines and back.

Pure functions over plain data, no I/O. ``encode_*`` returns one line without its
terminator; ``parse_*`` accepts a trailing ``"\\n"`` or ``"\\r\\n"``. Fields are separated
by single spaces (parsers tolerate runs of whitespace, except inside the ``ERR``/``WARN``
message and the ``READY`` JSON, which are taken verbatim). Anything malformed, on either
side, raises :class:`ProtocolError`.

What the design leaves open is settled here:

* ``<rid>`` matches ``[A-Za-z0-9_-]+`` and is never ``-``, which means "no request" in
  ``ERR``/``WARN``.
* GEN keys and DONE stat keys match ``[a-z_][a-z0-9_]*``; values are non-empty printable
  ASCII without spaces and may contain ``:``, ``,`` and ``=`` (a pair splits on its first
  ``=``). Key order is kept; a repeated key is an error.
* Base64 fields use the standard alphabet with padding. An empty payload is written as a
  single ``-`` (not a base64 character), so the empty text and the empty vocabulary
  round-trip.
* ``TOKENIZE <rid> <b64 of UTF-8 text> [special=1]``; ``special=0`` is accepted too.
* ``VOCAB <rid> <b64>``: the payload is every piece in id order, each a uint16
  little-endian byte length followed by its bytes, so a piece holds at most 65535 bytes.
* Logprobs are written with ``repr(float)`` and round-trip exactly; ``inf`` and ``-inf``
  are allowed, NaN is not.
* ``ERR``/``WARN`` messages are free text; encoding turns line breaks into spaces. An
  ``ERR`` that begins with :data:`GRAMMAR_REFUSED` says the request's grammar is what
  failed (the caller's constraint, not the engine): the server answers it with a 400.
* ``EMBED <rid> <id> ...``: one input's token ids (at least one), for its pooled
  embedding; answered ``EMBEDDING <rid> <b64>``, the vector as float32 little-endian, every
  value finite (an engine that computed NaN or infinity says so with ``ERR`` instead).
* ``MTOKENIZE <rid> <part> ...``: a prompt with media, each part ``t:<b64 of UTF-8 text>``
  (special tokens' text read as those tokens) or ``m:<b64 of a media file>`` (an image or
  audio clip as sent: PNG, JPEG, WAV, MP3 ...), in order; answered ``MTOKENS <rid> <spans>
  <id> ...``: the prompt's ids, 0 at each media position, and ``<spans>`` = ``-`` or
  ``<key>:<pos>:<n>,...``, one per media item: the hex key of its bytes, its first position,
  how many it takes (or ``ERR <rid>`` when an item does not decode). ``GEN`` names the items
  in its prompt with ``media=<spans>``, as answered.
* ``SLOT <rid> list``, ``SLOT <rid> save|restore <slot> <b64 of the file's path>``, ``SLOT
  <rid> erase <slot>``: the slots' state, or one idle slot's cache written to a file (its
  tokens and KV), read back from one, or dropped; answered ``SLOTINFO <rid> <json>`` (or
  ``ERR <rid>``: a slot that does not exist or is busy, a file llama.cpp cannot read).
* ``READY`` and ``SLOTINFO`` carry JSON, written compactly (``ensure_ascii``, so one ASCII line).
* ``LORA <rid> load <b64 path>`` loads a LoRA adapter GGUF (at default scale 0), ``LORA
  <rid> unload <id>`` frees one, ``LORA <rid> scales <id>:<scale>,...`` (or ``-``) sets the
  default scales (an adapter left out: 0); each is answered ``ADAPTERS <rid> <id>:<scale>:
  <b64 path> ...``, the adapters loaded after it, or ``ERR <rid>``.
* A GEN value that is free text (a grammar) travels as base64 of its UTF-8 bytes behind a
  ``<kind>:`` tag, so spaces, line breaks, ``=`` and non-ASCII round-trip:
  :func:`encode_grammar` / :func:`parse_grammar`. ``grammar`` is ``json_object`` or
  ``<kind>:<b64>`` with kind ``llguidance`` (an llguidance grammar: a Lark grammar or
  llguidance's grammar JSON, as ``LLMatcher.grammar_from_*`` return), ``json_schema``,
  ``lark`` or ``regex``.
"""

from __future__ import annotations

import base64
import json
import math
import operator
import re
import string
import struct
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

PROTOCOL_VERSION = 1
DONE_REASONS = frozenset({"stop", "length", "cancelled", "error"})

_RID_CHARS = frozenset(string.ascii_letters + string.digits + "_-")
_KEY = re.compile(r"[a-z_][a-z0-9_]*")
# Everything str.splitlines() breaks on: a reader must never see a second line.
_LINE_BREAK = re.compile("[\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]")
_EMPTY_B64 = "-"
_MAX_PIECE = 0xFFFF
_QUOTE_MAX = 120
#: ``grammar=<kind>:<b64>`` kinds; ``json_object`` stands alone (any JSON object).
GRAMMAR_KINDS = ("llguidance", "json_schema", "lark", "regex")
JSON_OBJECT = "json_object"
#: How an ``ERR`` begins when llguidance refused the request's grammar; a short reason follows.
GRAMMAR_REFUSED = "grammar refused:"
#: How an ``ERR`` to ``SLOT`` begins when the slot runs a request (the server asks again later).
SLOT_BUSY = "slot busy:"


class ProtocolError(ValueError):
    """A line, or a value to encode, that breaks the engine protocol."""


# --- commands, server -> engine ----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Gen:
    rid: str
    keys: Mapping[str, str]
    prompt: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Cancel:
    rid: str


@dataclass(frozen=True, slots=True)
class Tokenize:
    rid: str
    text: str
    special: bool = False


@dataclass(frozen=True, slots=True)
class MediaTokenize:
    rid: str
    parts: tuple[tuple[str, bytes], ...]  # ("text", UTF-8 bytes) or ("media", file bytes)


@dataclass(frozen=True, slots=True)
class VocabRequest:
    rid: str


@dataclass(frozen=True, slots=True)
class Embed:
    rid: str
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SlotCommand:
    rid: str
    action: str  # one of SLOT_ACTIONS
    slot: int = -1  # -1 for list
    path: str = ""  # save and restore: the file


#: ``SLOT`` actions, and which take a slot and a path
SLOT_ACTIONS = {"list": (False, False), "save": (True, True), "restore": (True, True), "erase": (True, False)}


@dataclass(frozen=True, slots=True)
class LoraLoad:
    rid: str
    path: str


@dataclass(frozen=True, slots=True)
class LoraUnload:
    rid: str
    id: int


@dataclass(frozen=True, slots=True)
class LoraScales:
    rid: str
    scales: tuple[tuple[int, float], ...]  # (adapter id, default scale); left out: 0


@dataclass(frozen=True, slots=True)
class Quit:
    pass


LoraCommand: TypeAlias = LoraLoad | LoraUnload | LoraScales
Command: TypeAlias = Gen | Cancel | Tokenize | MediaTokenize | VocabRequest | Embed | SlotCommand | LoraCommand | Quit

# --- events, engine -> server ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    info: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Token:
    rid: str
    id: int


@dataclass(frozen=True, slots=True)
class Logprob:
    rid: str
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True, slots=True)
class Done:
    rid: str
    reason: str
    stats: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Tokens:
    rid: str
    ids: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class MediaSpan:
    key: str  # hex digits of the item's hash
    pos: int  # the prompt position of its first token
    n: int  # positions it takes


@dataclass(frozen=True, slots=True)
class MediaTokens:
    rid: str
    ids: tuple[int, ...]
    spans: tuple[MediaSpan, ...]


@dataclass(frozen=True, slots=True)
class Vocab:
    rid: str
    pieces: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class Embedding:
    rid: str
    vector: tuple[float, ...]  # float32 values


@dataclass(frozen=True, slots=True)
class SlotInfo:
    rid: str
    info: Any  # JSON: the slots (list) or what an action did (an object)


@dataclass(frozen=True, slots=True)
class LoraAdapter:
    id: int
    scale: float  # what a request without scales of its own gets
    path: str


@dataclass(frozen=True, slots=True)
class Adapters:
    rid: str
    adapters: tuple[LoraAdapter, ...]


@dataclass(frozen=True, slots=True)
class Error:
    rid: str | None
    message: str


@dataclass(frozen=True, slots=True)
class Warn:
    rid: str | None
    message: str


Event: TypeAlias = (
    Ready | Token | Logprob | Done | Tokens | MediaTokens | Vocab | Embedding | SlotInfo | Adapters | Error | Warn
)

# --- fields: each checker returns the value or raises ProtocolError(what was wrong) -------


def _is_rid(s: str) -> bool:
    return _RID_CHARS.issuperset(s) and s != "-" and s != ""


def _rid(s: str) -> str:
    if isinstance(s, str) and _is_rid(s):
        return s
    raise ProtocolError(f"bad rid {s!r} (expected [A-Za-z0-9_-]+, and not '-')")


def _uint(s: str) -> int:
    if s.isascii() and s.isdigit():
        return int(s)
    raise ProtocolError(f"bad token id {s!r} (expected a non-negative integer)")


def _uints(items: list[str]) -> tuple[int, ...]:
    joined = "".join(items)
    if not (joined.isascii() and joined.isdigit()):
        for s in items:  # find the culprit for the message
            _uint(s)
    return tuple(map(int, items))


def _logprob(s: str) -> float:
    if s.isascii():
        try:
            value = float(s)
        except ValueError:
            pass
        else:
            if value == value:
                return value
    raise ProtocolError(f"bad logprob {s!r} (expected a float, inf or -inf; not NaN)")


def _tid(x: int) -> int:
    tid = operator.index(x)  # numpy integers are welcome, floats and strings are not
    if tid < 0:
        raise ProtocolError(f"bad token id {tid} (expected a non-negative integer)")
    return tid


def _float(x: float) -> str:
    value = float(x)
    if value != value:
        raise ProtocolError("a logprob cannot be NaN")
    return repr(value)


def _ids(ids: Iterable[int]) -> str:
    return " ".join([str(_tid(i)) for i in ids])


def _pair(key: str, value: str) -> str:
    if not (isinstance(key, str) and _KEY.fullmatch(key)):
        raise ProtocolError(f"bad key {key!r} (expected [a-z_][a-z0-9_]*)")
    if not (
        isinstance(value, str)
        and value.isascii()
        and value.isprintable()
        and value
        and " " not in value
    ):
        raise ProtocolError(
            f"bad value {value!r} for key {key!r} (expected non-empty printable ASCII "
            "without spaces; base64 anything else)"
        )
    return f"{key}={value}"


def _parse_pairs(items: list[str]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise ProtocolError(f"expected key=value, got {item!r}")
        _pair(key, value)
        if key in pairs:
            raise ProtocolError(f"key {key!r} given twice")
        pairs[key] = value
    return pairs


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii") if data else _EMPTY_B64


def _unb64(field: str) -> bytes:
    if field == _EMPTY_B64:
        return b""
    try:
        return base64.b64decode(field, validate=True)
    except ValueError:
        raise ProtocolError(f"bad base64 {field[:40]!r} (use '-' for empty)") from None


def encode_grammar(kind: str, text: str = "") -> str:
    """The ``grammar`` GEN value for ``text`` of ``kind`` (``json_object`` takes no text)."""
    if kind == JSON_OBJECT:
        if text:
            raise ProtocolError("json_object takes no grammar text")
        return JSON_OBJECT
    if kind not in GRAMMAR_KINDS:
        raise ProtocolError(f"bad grammar kind {kind!r} (expected {JSON_OBJECT} or one of {GRAMMAR_KINDS})")
    return f"{kind}:{_b64(text.encode('utf-8'))}"


def parse_grammar(value: str) -> tuple[str, str]:
    """(kind, text) of a ``grammar`` GEN value; the text is ``""`` for ``json_object``."""
    if value == JSON_OBJECT:
        return JSON_OBJECT, ""
    kind, sep, payload = value.partition(":")
    if not sep or kind not in GRAMMAR_KINDS:
        raise ProtocolError(
            f"bad grammar {_clip(value)!r} (expected {JSON_OBJECT} or <kind>:<b64> with kind "
            f"one of {', '.join(GRAMMAR_KINDS)})"
        )
    try:
        return kind, _unb64(payload).decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("grammar text is not UTF-8") from None


def _pack_pieces(pieces: Iterable[bytes]) -> bytes:
    out = bytearray()
    for i, piece in enumerate(pieces):
        if len(piece) > _MAX_PIECE:
            raise ProtocolError(f"vocab piece {i} is {len(piece)} bytes (at most {_MAX_PIECE})")
        out += len(piece).to_bytes(2, "little")
        out += piece
    return bytes(out)


def _unpack_pieces(data: bytes) -> tuple[bytes, ...]:
    pieces: list[bytes] = []
    i, n = 0, len(data)
    while i < n:
        start = i + 2
        if start > n or (end := start + (data[i] | data[i + 1] << 8)) > n:
            raise ProtocolError(f"vocab payload truncated in piece {len(pieces)}")
        pieces.append(data[start:end])
        i = end
    return tuple(pieces)


def _pack_floats(values: Iterable[float]) -> bytes:
    floats = [float(v) for v in values]
    if not all(map(math.isfinite, floats)):
        raise ProtocolError("an embedding holds only finite values")
    return struct.pack(f"<{len(floats)}f", *floats)


def _unpack_floats(data: bytes) -> tuple[float, ...]:
    if len(data) % 4:
        raise ProtocolError(f"embedding payload of {len(data)} bytes is not float32s")
    floats = struct.unpack(f"<{len(data) // 4}f", data)
    if not all(map(math.isfinite, floats)):
        raise ProtocolError("an embedding holds only finite values")
    return floats


_HEX = frozenset("0123456789abcdef")
_PART_KINDS = {"t": "text", "m": "media"}


def encode_spans(spans: Iterable[MediaSpan]) -> str:
    """Media spans as ``MTOKENS`` and ``GEN media=`` write them (``-``: none)."""
    out = []
    for sp in spans:
        if not (sp.key and _HEX.issuperset(sp.key)) or sp.pos < 0 or sp.n < 1:
            raise ProtocolError(f"bad media span {sp!r} (expected a hex key, pos >= 0, n >= 1)")
        out.append(f"{sp.key}:{int(sp.pos)}:{int(sp.n)}")
    return ",".join(out) or _EMPTY_B64


def parse_spans(field: str) -> tuple[MediaSpan, ...]:
    if field == _EMPTY_B64:
        return ()
    spans = []
    for item in field.split(","):
        key, _, rest = item.partition(":")
        pos, _, n = rest.partition(":")
        if not (key and _HEX.issuperset(key)):
            raise ProtocolError(f"bad media span {item!r} (expected <hex key>:<pos>:<n>)")
        spans.append(MediaSpan(key, _uint(pos), _uint(n)))
    return tuple(spans)


def _strip_eol(line: str) -> str:
    if line.endswith("\n"):
        line = line[:-1]
    return line[:-1] if line.endswith("\r") else line


def _clip(text: str) -> str:
    return text if len(text) <= _QUOTE_MAX else text[:_QUOTE_MAX] + "..."


def _fields(parts: list[str], n: int, form: str, at_least: bool = False) -> list[str]:
    if len(parts) == n or (at_least and len(parts) > n):
        return parts
    raise ProtocolError(f"expected {form!r}")


# --- encoding ----------------------------------------------------------------------------


def _encode_event(ev: Event) -> str:
    if isinstance(ev, Token):  # the hot path: one per generated token
        return f"T {_rid(ev.rid)} {_tid(ev.id)}"
    if isinstance(ev, Logprob):
        alts = "".join(f" {_tid(i)}:{_float(lp)}" for i, lp in ev.top)
        return f"LP {_rid(ev.rid)} {_float(ev.logprob)}{alts}"
    if isinstance(ev, Done):
        if ev.reason not in DONE_REASONS:
            raise ProtocolError(
                f"bad reason {ev.reason!r} (expected one of {sorted(DONE_REASONS)})"
            )
        return " ".join(["DONE", _rid(ev.rid), ev.reason, *(_pair(*kv) for kv in ev.stats.items())])
    if isinstance(ev, Tokens):
        return f"TOKENS {_rid(ev.rid)} {_ids(ev.ids)}".rstrip(" ")
    if isinstance(ev, MediaTokens):
        return f"MTOKENS {_rid(ev.rid)} {encode_spans(ev.spans)} {_ids(ev.ids)}".rstrip(" ")
    if isinstance(ev, Vocab):
        return f"VOCAB {_rid(ev.rid)} {_b64(_pack_pieces(ev.pieces))}"
    if isinstance(ev, Embedding):
        return f"EMBEDDING {_rid(ev.rid)} {_b64(_pack_floats(ev.vector))}"
    if isinstance(ev, Adapters):
        items = [f"{_tid(a.id)}:{_scale(a.scale)}:{_b64(a.path.encode('utf-8'))}" for a in ev.adapters]
        return " ".join(["ADAPTERS", _rid(ev.rid), *items])
    if isinstance(ev, (Error, Warn)):
        verb = "ERR" if isinstance(ev, Error) else "WARN"
        rid = "-" if ev.rid is None else _rid(ev.rid)
        return f"{verb} {rid} {_LINE_BREAK.sub(' ', ev.message)}"
    if isinstance(ev, Ready):
        return "READY " + json.dumps(dict(ev.info), separators=(",", ":"))
    if isinstance(ev, SlotInfo):
        return f"SLOTINFO {_rid(ev.rid)} " + json.dumps(ev.info, separators=(",", ":"))
    raise ProtocolError("not an event")


def _encode_command(cmd: Command) -> str:
    if isinstance(cmd, Gen):
        keys = "".join(f"{_pair(k, v)} " for k, v in cmd.keys.items())
        return f"GEN {_rid(cmd.rid)} {keys}: {_ids(cmd.prompt)}".rstrip(" ")
    if isinstance(cmd, Cancel):
        return f"CANCEL {_rid(cmd.rid)}"
    if isinstance(cmd, Tokenize):
        flag = " special=1" if cmd.special else ""
        return f"TOKENIZE {_rid(cmd.rid)} {_b64(cmd.text.encode('utf-8'))}{flag}"
    if isinstance(cmd, MediaTokenize):
        tags = {v: k for k, v in _PART_KINDS.items()}
        parts = " ".join(f"{tags[kind]}:{_b64(data)}" for kind, data in cmd.parts)
        return f"MTOKENIZE {_rid(cmd.rid)} {parts}".rstrip(" ")
    if isinstance(cmd, VocabRequest):
        return f"VOCAB {_rid(cmd.rid)}"
    if isinstance(cmd, Embed):
        if not cmd.ids:
            raise ProtocolError("EMBED needs at least one token id")
        return f"EMBED {_rid(cmd.rid)} {_ids(cmd.ids)}"
    if isinstance(cmd, SlotCommand):
        takes_slot, takes_path = _slot_action(cmd.action)
        slot = f" {_uint(str(cmd.slot))}" if takes_slot else ""
        path = f" {_b64(cmd.path.encode('utf-8'))}" if takes_path else ""
        return f"SLOT {_rid(cmd.rid)} {cmd.action}{slot}{path}"
    if isinstance(cmd, LoraLoad):
        return f"LORA {_rid(cmd.rid)} load {_b64(cmd.path.encode('utf-8'))}"
    if isinstance(cmd, LoraUnload):
        return f"LORA {_rid(cmd.rid)} unload {_tid(cmd.id)}"
    if isinstance(cmd, LoraScales):
        scales = ",".join(f"{_tid(i)}:{_scale(v)}" for i, v in cmd.scales)
        return f"LORA {_rid(cmd.rid)} scales {scales or _EMPTY_B64}"
    if isinstance(cmd, Quit):
        return "QUIT"
    raise ProtocolError("not a command")


def encode_event(ev: Event) -> str:
    """Write an event as one line, without the trailing newline."""
    try:
        return _encode_event(ev)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ProtocolError(f"cannot encode {_clip(repr(ev))}: {exc}") from exc


def encode_command(cmd: Command) -> str:
    """Write a command as one line, without the trailing newline."""
    try:
        return _encode_command(cmd)
    except (ValueError, TypeError, OverflowError) as exc:
        raise ProtocolError(f"cannot encode {_clip(repr(cmd))}: {exc}") from exc


# --- parsing -----------------------------------------------------------------------------


def _parse_logprob(parts: list[str]) -> Logprob:
    _fields(parts, 3, "LP <rid> <logprob> [<id>:<logprob> ...]", at_least=True)
    top: list[tuple[int, float]] = []
    for alt in parts[3:]:
        tid, sep, lp = alt.partition(":")
        if not sep:
            raise ProtocolError(f"bad alternative {alt!r} (expected <id>:<logprob>)")
        top.append((_uint(tid), _logprob(lp)))
    return Logprob(_rid(parts[1]), _logprob(parts[2]), tuple(top))


def _parse_done(line: str, parts: list[str]) -> Done:
    _fields(parts, 3, "DONE <rid> <reason> [key=value ...]", at_least=True)
    if parts[2] not in DONE_REASONS:
        raise ProtocolError(f"bad reason {parts[2]!r} (expected one of {sorted(DONE_REASONS)})")
    return Done(_rid(parts[1]), parts[2], _parse_pairs(parts[3:]))


def _parse_tokens(line: str, parts: list[str]) -> Tokens:
    _fields(parts, 2, "TOKENS <rid> [<id> ...]", at_least=True)
    return Tokens(_rid(parts[1]), _uints(parts[2:]))


def _parse_media_tokens(line: str, parts: list[str]) -> MediaTokens:
    _fields(parts, 3, "MTOKENS <rid> <spans> [<id> ...]", at_least=True)
    return MediaTokens(_rid(parts[1]), _uints(parts[3:]), parse_spans(parts[2]))


def _parse_vocab(line: str, parts: list[str]) -> Vocab:
    _fields(parts, 3, "VOCAB <rid> <b64>")
    return Vocab(_rid(parts[1]), _unpack_pieces(_unb64(parts[2])))


def _parse_embedding(line: str, parts: list[str]) -> Embedding:
    _fields(parts, 3, "EMBEDDING <rid> <b64>")
    return Embedding(_rid(parts[1]), _unpack_floats(_unb64(parts[2])))


def _scale(x: float) -> str:
    value = float(x)
    if not math.isfinite(value):
        raise ProtocolError(f"bad LoRA scale {value!r} (expected a finite float)")
    return repr(value)


def _parse_scale(s: str) -> float:
    try:
        value = float(s)
    except ValueError:
        value = math.nan
    if not (s.isascii() and math.isfinite(value)):
        raise ProtocolError(f"bad LoRA scale {s[:40]!r} (expected a finite float)")
    return value


def _parse_adapters(line: str, parts: list[str]) -> Adapters:
    _fields(parts, 2, "ADAPTERS <rid> [<id>:<scale>:<b64 path> ...]", at_least=True)
    out = []
    for item in parts[2:]:
        fields = item.split(":")
        if len(fields) != 3:
            raise ProtocolError(f"bad adapter {_clip(item)!r} (expected <id>:<scale>:<b64 path>)")
        try:
            path = _unb64(fields[2]).decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("an adapter's path is not UTF-8") from None
        out.append(LoraAdapter(_uint(fields[0]), _parse_scale(fields[1]), path))
    return Adapters(_rid(parts[1]), tuple(out))


def _parse_lora(parts: list[str]) -> LoraCommand:
    _fields(parts, 4, "LORA <rid> load <b64 path> | unload <id> | scales <id>:<scale>,...")
    rid, op, arg = _rid(parts[1]), parts[2], parts[3]
    if op == "load":
        try:
            return LoraLoad(rid, _unb64(arg).decode("utf-8"))
        except UnicodeDecodeError:
            raise ProtocolError("LORA load's path is not UTF-8") from None
    if op == "unload":
        return LoraUnload(rid, _uint(arg))
    if op == "scales":
        pairs = [] if arg == _EMPTY_B64 else [p.partition(":") for p in arg.split(",")]
        if any(not sep for _, sep, _ in pairs):
            raise ProtocolError(f"bad LORA scales {_clip(arg)!r} (expected <id>:<scale>,... or -)")
        return LoraScales(rid, tuple((_uint(i), _parse_scale(v)) for i, _, v in pairs))
    raise ProtocolError(f"bad LORA operation {op[:20]!r} (expected load, unload or scales)")


def _parse_message(line: str, parts: list[str]) -> Error | Warn:
    verb, _, rest = _strip_eol(line).partition(" ")
    rid, _, message = rest.partition(" ")
    if verb != parts[0] or not rid:
        raise ProtocolError(f"expected '{parts[0]} <rid or -> <message>', single-spaced")
    if _LINE_BREAK.search(message):
        raise ProtocolError("message contains a line break")
    cls = Error if verb == "ERR" else Warn
    return cls(None if rid == "-" else _rid(rid), message)


def _parse_ready(line: str, parts: list[str]) -> Ready:
    body = _strip_eol(line)
    if not body.startswith("READY "):
        raise ProtocolError("expected 'READY <json object>'")
    try:
        info = json.loads(body[6:])
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"bad READY json ({exc})") from None
    if not isinstance(info, dict):
        raise ProtocolError(f"READY json must be an object, got {type(info).__name__}")
    return Ready(info)


def _parse_slot_info(line: str, parts: list[str]) -> SlotInfo:
    _fields(parts, 3, "SLOTINFO <rid> <json>", at_least=True)
    rid = _rid(parts[1])
    try:
        return SlotInfo(rid, json.loads(_strip_eol(line).split(" ", 2)[2]))
    except (ValueError, IndexError, RecursionError) as exc:
        raise ProtocolError(f"bad SLOTINFO json ({exc})") from None


_EVENT_PARSERS: dict[str, Callable[[str, list[str]], Event]] = {
    "DONE": _parse_done,
    "TOKENS": _parse_tokens,
    "MTOKENS": _parse_media_tokens,
    "VOCAB": _parse_vocab,
    "EMBEDDING": _parse_embedding,
    "ADAPTERS": _parse_adapters,
    "ERR": _parse_message,
    "WARN": _parse_message,
    "READY": _parse_ready,
    "SLOTINFO": _parse_slot_info,
}


def parse_event(line: str) -> Event:
    """Parse one line from the engine; raise ProtocolError if it is malformed."""
    parts = line.split()
    if not parts:
        raise ProtocolError(f"empty line {_clip(line)!r} (expected an event)")
    try:
        verb = parts[0]
        if verb == "T":  # the hot path: one per generated token
            if len(parts) == 3 and _is_rid(parts[1]):
                return Token(parts[1], _uint(parts[2]))
            return Token(_rid(_fields(parts, 3, "T <rid> <id>")[1]), _uint(parts[2]))
        if verb == "LP":
            return _parse_logprob(parts)
        parser = _EVENT_PARSERS.get(verb)
        if parser is None:
            raise ProtocolError(
                f"unknown event {verb[:20]!r} (expected T, LP, {', '.join(_EVENT_PARSERS)})"
            )
        return parser(line, parts)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"{exc} in line {_clip(_strip_eol(line))!r}") from None


def _parse_gen(parts: list[str]) -> Gen:
    if len(parts) < 3 or ":" not in parts[2:]:
        raise ProtocolError("expected 'GEN <rid> [key=value ...] : <id> ...' with a lone ':'")
    sep = parts.index(":", 2)
    return Gen(_rid(parts[1]), _parse_pairs(parts[2:sep]), _uints(parts[sep + 1 :]))


def _parse_tokenize(parts: list[str]) -> Tokenize:
    _fields(parts, 3, "TOKENIZE <rid> <b64 text> [special=1]", at_least=True)
    if parts[3:] not in ([], ["special=1"], ["special=0"]):
        raise ProtocolError(
            f"bad TOKENIZE flags {_clip(' '.join(parts[3:]))!r} (expected nothing or special=1)"
        )
    try:
        text = _unb64(parts[2]).decode("utf-8")
    except UnicodeDecodeError:
        raise ProtocolError("TOKENIZE text is not UTF-8") from None
    return Tokenize(_rid(parts[1]), text, parts[3:] == ["special=1"])


def _parse_media_tokenize(parts: list[str]) -> MediaTokenize:
    _fields(parts, 2, "MTOKENIZE <rid> [t:<b64> | m:<b64> ...]", at_least=True)
    out = []
    for item in parts[2:]:
        tag, sep, data = item.partition(":")
        if not sep or tag not in _PART_KINDS:
            raise ProtocolError(f"bad MTOKENIZE part {_clip(item)!r} (expected t:<b64> or m:<b64>)")
        out.append((_PART_KINDS[tag], _unb64(data)))
    return MediaTokenize(_rid(parts[1]), tuple(out))


def _slot_action(action: str) -> tuple[bool, bool]:
    if action not in SLOT_ACTIONS:
        raise ProtocolError(f"bad SLOT action {action[:20]!r} (expected one of {', '.join(SLOT_ACTIONS)})")
    return SLOT_ACTIONS[action]


def _parse_slot(parts: list[str]) -> SlotCommand:
    _fields(parts, 3, "SLOT <rid> <action> [<slot> [<b64 path>]]", at_least=True)
    takes_slot, takes_path = _slot_action(parts[2])
    form = f"SLOT <rid> {parts[2]}" + " <slot>" * takes_slot + " <b64 path>" * takes_path
    _fields(parts, 3 + takes_slot + takes_path, form)
    try:
        path = _unb64(parts[4]).decode("utf-8") if takes_path else ""
    except UnicodeDecodeError:
        raise ProtocolError("SLOT path is not UTF-8") from None
    return SlotCommand(_rid(parts[1]), parts[2], _uint(parts[3]) if takes_slot else -1, path)


def parse_command(line: str) -> Command:
    """Parse one line from the server; raise ProtocolError if it is malformed."""
    parts = line.split()
    if not parts:
        raise ProtocolError(f"empty line {_clip(line)!r} (expected a command)")
    try:
        verb = parts[0]
        if verb == "GEN":
            return _parse_gen(parts)
        if verb == "CANCEL":
            return Cancel(_rid(_fields(parts, 2, "CANCEL <rid>")[1]))
        if verb == "TOKENIZE":
            return _parse_tokenize(parts)
        if verb == "MTOKENIZE":
            return _parse_media_tokenize(parts)
        if verb == "VOCAB":
            return VocabRequest(_rid(_fields(parts, 2, "VOCAB <rid>")[1]))
        if verb == "EMBED":
            _fields(parts, 3, "EMBED <rid> <id> ...", at_least=True)
            return Embed(_rid(parts[1]), _uints(parts[2:]))
        if verb == "SLOT":
            return _parse_slot(parts)
        if verb == "LORA":
            return _parse_lora(parts)
        if verb == "QUIT":
            _fields(parts, 1, "QUIT")
            return Quit()
        raise ProtocolError(
            f"unknown command {verb[:20]!r} (expected GEN, CANCEL, TOKENIZE, MTOKENIZE, VOCAB, EMBED, SLOT, LORA, QUIT)"
        )
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"{exc} in line {_clip(_strip_eol(line))!r}") from None
