"""EngineClient: the one reader of an engine's events, and its supervisor.

One asyncio task reads the engine's stdout, demultiplexes events by request id and
pairs each ``LP`` with its ``T``; it needs no timeouts because every request says up
front whether LP lines are due. When the engine exits, every request in flight ends
with an error and the supervisor starts a new engine, with backoff. The engine's stderr
(llama.cpp's log, Python's warnings and stack dumps) goes to a log file when one is
given; an unexpected exit is logged with that file's last lines.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import shlex
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from strata_core.contract import protocol as proto
from strata_core.contract.events import Finished, TokenEvent
from strata_core.contract.options import GenOptions
from strata_core.ops.config import EngineConfig, SpeculativeConfig

log = logging.getLogger("strata.engine")


class MediaPrompt(list[int]):
    """A prompt's token ids (0 at media positions) and where its media items sit, which
    travel with it to the engine (GEN ``media=``)."""

    def __init__(self, ids: Iterable[int], spans: Sequence[proto.MediaSpan] = ()) -> None:
        super().__init__(ids)
        self.spans = tuple(spans)


class EngineUnavailable(RuntimeError):
    """The engine is not running, or died while serving the request."""


class EngineRefused(EngineUnavailable):
    """The engine answered a question with ERR: it cannot do what was asked (say, decode a
    media item); the message says why."""


@dataclass(eq=False)
class RequestStream:
    """What one GEN request yields: TokenEvents, then one Finished."""

    rid: str
    wants_lp: bool
    tokens: int = 0  # held in the engine's context: the prompt, and each token emitted since
    lora: Mapping[int, float] = field(default_factory=dict)  # its own adapter scales; empty: the configured ones
    prompt: int = 0  # the prompt's tokens (tokens - prompt: the tokens emitted so far)
    started: float = field(default_factory=time.monotonic)
    queue: asyncio.Queue[TokenEvent | Finished] = field(default_factory=asyncio.Queue)
    held: int | None = None  # a T waiting for its LP
    error: str | None = None
    finished: bool = False

    async def events(self) -> AsyncIterator[list[TokenEvent | Finished]]:
        """Everything that arrived since the last yield, at least one event: tokens that
        came together (a speculative window, or a server behind the engine) are handled,
        and streamed, together. Ends after Finished."""
        while True:
            evs = [await self.queue.get()]
            while not self.queue.empty() and not isinstance(evs[-1], Finished):
                evs.append(self.queue.get_nowait())
            yield evs
            if isinstance(evs[-1], Finished):
                return


@dataclass(frozen=True)
class EngineCommand:
    """How to start the engine process."""

    argv: Sequence[str]
    env: Mapping[str, str]


#: Lines of the engine's log shown when it exits unexpectedly.
LOG_TAIL_LINES = 20


def log_tail(path: Path, n: int = LOG_TAIL_LINES) -> list[str]:
    """The last ``n`` lines of a log file (read from its end: the file only grows)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 64 * 1024))
            lines = f.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return []
    return lines[-n:]


def exit_status(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


class EngineClient:
    """``log_path``: the file the engine's stderr is appended to (None: the server's console)."""

    def __init__(self, command: EngineCommand, log_path: Path | None = None) -> None:
        self.command = command
        self.log_path = log_path
        self.info: dict[str, Any] = {}
        self.ready = asyncio.Event()
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        #: tokens the engine emitted, counted as they arrive (a live count; /metrics counts at DONE)
        self.emitted = 0
        self.done_reasons: collections.Counter[str] = collections.Counter()
        self._streams: dict[str, RequestStream] = {}
        self._replies: dict[str, asyncio.Future[Any]] = {}
        self._ids = itertools.count()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._started = asyncio.Event()
        self.start_error: str | None = None
        #: the last engine process's exit code (None: none has exited, or it could not start)
        self.exit_code: int | None = None

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        self._task = asyncio.create_task(self._supervise())
        await self._started.wait()

    @property
    def supervised(self) -> bool:
        """Whether the supervisor (which restarts the engine when it exits) is running."""
        return self._task is not None and not self._task.done()

    async def wait_ready(self) -> None:
        await self.ready.wait()

    async def close(self) -> None:
        self._closing = True
        proc = self.proc
        if proc is not None and proc.returncode is None:
            try:
                assert proc.stdin is not None
                proc.stdin.write(b"QUIT\n")
                await asyncio.wait_for(proc.wait(), 10)
            except (OSError, asyncio.TimeoutError):
                proc.kill()
        if self._task:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _supervise(self) -> None:
        backoff = 0.25
        while not self._closing:
            loop = asyncio.get_running_loop()
            began = loop.time()
            code = self.exit_code = await self._run_once()
            self._fail_all("the engine exited")
            self.ready.clear()
            if self._closing:
                return
            if loop.time() - began > 30:
                backoff = 0.25
            self.restarts += 1
            self._report_exit(code, backoff)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 10.0)

    def _report_exit(self, code: int | None, backoff: float) -> None:
        """An unexpected exit, on the console: why, and where the engine said why."""
        what = f"the engine exited unexpectedly ({exit_status(code)}); restarting in {backoff:.2f} s"
        if self.log_path is None:
            log.warning("%s", what)
            return
        tail = log_tail(self.log_path)
        log.warning("%s. The last %d lines of its log, %s:\n%s", what, len(tail), self.log_path,
                    "\n".join("    " + line for line in tail))  # fmt: skip

    def _open_log(self) -> IO[bytes] | None:
        """The engine's stderr: the log file, opened to append (None: the console)."""
        if self.log_path is None:
            return None
        try:
            f = open(self.log_path, "ab")
        except OSError as exc:
            log.warning("cannot write the engine's log %s (%s); it goes to the console", self.log_path, exc)
            return None
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        f.write(f"\n==== {stamp} strata starts the engine: {shlex.join(self.command.argv)}\n".encode())
        f.flush()
        return f

    async def _run_once(self) -> int | None:
        """Run one engine until it exits; its exit code (None: it could not start)."""
        env = dict(os.environ)
        env.update(self.command.env)
        stderr = self._open_log()
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.command.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
                env=env,
                limit=64 * 1024 * 1024,  # the VOCAB reply is one long line
            )
        except OSError as exc:
            self.start_error = f"cannot start the engine: {exc}"
            self._started.set()
            return None
        finally:
            if stderr is not None:
                stderr.close()  # the engine holds its own copy
        try:
            await self._read(self.proc)
        finally:
            if self.proc.returncode is None:
                self.proc.kill()
            await self.proc.wait()
        return self.proc.returncode

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        stdout = proc.stdout
        while True:
            line = await stdout.readline()
            if not line:
                return
            try:
                ev = proto.parse_event(line.decode("utf-8", "replace"))
            except proto.ProtocolError as exc:
                log.error("engine sent a malformed line: %s", exc)
                continue
            self._dispatch(ev)

    # ---- demultiplexing --------------------------------------------------------------

    def _dispatch(self, ev: proto.Event) -> None:
        if isinstance(ev, proto.Token):
            st = self._streams.get(ev.rid)
            if st is None:
                return
            st.tokens += 1
            self.emitted += 1
            if st.held is not None:  # an LP never came for the previous T
                st.queue.put_nowait(TokenEvent(st.held))
                st.held = None
            if st.wants_lp:
                st.held = ev.id
            else:
                st.queue.put_nowait(TokenEvent(ev.id))
        elif isinstance(ev, proto.Logprob):
            st = self._streams.get(ev.rid)
            if st is not None and st.held is not None:
                st.queue.put_nowait(TokenEvent(st.held, ev))
                st.held = None
        elif isinstance(ev, proto.Done):
            st = self._streams.pop(ev.rid, None)
            self.done_reasons[ev.reason] += 1
            if st is not None:
                if st.held is not None:
                    st.queue.put_nowait(TokenEvent(st.held))
                st.finished = True
                st.queue.put_nowait(Finished(ev.reason, ev.stats, st.error))
        elif isinstance(ev, proto.Error):
            if ev.rid is not None and ev.rid in self._streams:
                self._streams[ev.rid].error = ev.message
            elif ev.rid is not None and ev.rid in self._replies:
                asked = self._replies.pop(ev.rid)
                if not asked.done():  # its asker may have gone (a client that hung up)
                    asked.set_exception(EngineRefused(ev.message))
            else:
                log.error("engine: %s", ev.message)
                if not self.ready.is_set():
                    self.start_error = ev.message
        elif isinstance(ev, proto.Warn):
            log.warning("engine: %s %s", ev.rid or "-", ev.message)
        elif isinstance(ev, (proto.Tokens, proto.MediaTokens, proto.Vocab, proto.Embedding, proto.SlotInfo, proto.Adapters)):
            if isinstance(ev, proto.Adapters):  # what READY said of them, as they are now
                self.info["lora"] = [{"id": a.id, "path": a.path, "scale": a.scale} for a in ev.adapters]
            fut = self._replies.pop(ev.rid, None)
            if fut is not None and not fut.done():
                fut.set_result(ev)
        elif isinstance(ev, proto.Ready):
            self.info = dict(ev.info)
            self.start_error = None
            self.ready.set()
            self._started.set()

    def _fail_all(self, why: str) -> None:
        if not self._started.is_set():
            self.start_error = self.start_error or why
            self._started.set()
        for st in self._streams.values():
            st.finished = True
            st.queue.put_nowait(Finished("error", {}, why))
        self._streams.clear()
        for fut in self._replies.values():
            if not fut.done():
                fut.set_exception(EngineUnavailable(why))
        self._replies.clear()

    # ---- requests --------------------------------------------------------------------

    def _send(self, cmd: proto.Command) -> None:
        proc = self.proc
        if not self.ready.is_set() or proc is None or proc.stdin is None:
            raise EngineUnavailable("the engine is not ready")
        try:
            proc.stdin.write((proto.encode_command(cmd) + "\n").encode())
        except (OSError, RuntimeError) as exc:
            raise EngineUnavailable(f"the engine is gone: {exc}") from None

    def new_rid(self, prefix: str = "r") -> str:
        return f"{prefix}{next(self._ids)}"

    def generate(self, prompt: Sequence[int], options: GenOptions, rid: str | None = None) -> RequestStream:
        """Start a request; a MediaPrompt's media items are named in its GEN (``media=``)."""
        rid = rid or self.new_rid()
        st = RequestStream(rid, wants_lp=options.logprobs is not None, tokens=len(prompt), prompt=len(prompt),
                           lora=options.lora)
        keys = options.encode()
        if isinstance(prompt, MediaPrompt) and prompt.spans:
            keys = {**keys, "media": proto.encode_spans(prompt.spans)}
        self._send(proto.Gen(rid, keys, tuple(prompt)))
        self._streams[rid] = st
        return st

    def cancel(self, rid: str) -> None:
        if rid in self._streams:
            try:
                self._send(proto.Cancel(rid))
            except EngineUnavailable:
                pass

    async def _ask(
        self,
        cmd: proto.Tokenize | proto.MediaTokenize | proto.VocabRequest | proto.Embed | proto.SlotCommand | proto.LoraCommand,
    ) -> Any:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._replies[cmd.rid] = fut
        try:
            self._send(cmd)
        except EngineUnavailable:
            self._replies.pop(cmd.rid, None)
            raise
        return await fut

    async def tokenize(self, text: str, special: bool = True) -> list[int]:
        ev = await self._ask(proto.Tokenize(self.new_rid("t"), text, special))
        return list(ev.ids)

    async def tokenize_media(self, parts: Sequence[tuple[str, bytes]]) -> MediaPrompt:
        """A prompt of text and media parts (("text", UTF-8) or ("media", file bytes)) as
        the engine's mtmd tokenizes it; EngineRefused names a media item it cannot take."""
        ev = await self._ask(proto.MediaTokenize(self.new_rid("m"), tuple(parts)))
        return MediaPrompt(ev.ids, ev.spans)

    async def vocab(self) -> list[bytes]:
        ev = await self._ask(proto.VocabRequest(self.new_rid("v")))
        return list(ev.pieces)

    async def embed(self, ids: Sequence[int]) -> tuple[float, ...]:
        """One input's pooled embedding, as the engine computed it (not normalised)."""
        ev = await self._ask(proto.Embed(self.new_rid("e"), tuple(ids)))
        return ev.vector  # type: ignore[no-any-return]

    async def slot(self, action: str, slot: int = -1, path: str = "") -> Any:
        """A slot action's answer (``SLOT``): the slots' state for ``list``, else what
        ``save``, ``restore`` or ``erase`` did; EngineRefused says why not."""
        ev = await self._ask(proto.SlotCommand(self.new_rid("s"), action, slot, path))
        return ev.info

    async def lora(self, op: str, arg: Any) -> None:
        """Change the engine's LoRA adapters (op load: a path; unload: an id; scales: id ->
        default scale); ``info["lora"]`` lists them after. EngineRefused says why not."""
        rid = self.new_rid("l")
        cmd: proto.LoraCommand
        if op == "load":
            cmd = proto.LoraLoad(rid, arg)
        elif op == "unload":
            cmd = proto.LoraUnload(rid, arg)
        else:
            cmd = proto.LoraScales(rid, tuple(arg.items()))
        await self._ask(cmd)

    @property
    def in_flight(self) -> int:
        return len(self._streams)

    def in_slots(self) -> tuple[list[RequestStream], list[RequestStream]]:
        """The requests in flight in the engine's slots, and those waiting for one: the
        oldest hold the slots, one each (the engine admits in order)."""
        streams = list(self._streams.values())
        slots = int(self.info.get("slots", 0))
        return streams[:slots], streams[slots:]

    def kv_cells(self) -> int:
        """The engine's KV cache cells (one token each): n_ctx x slots; 0 before READY."""
        return int(self.info.get("slots", 0)) * int(self.info.get("n_ctx", 0))

    def kv_usage(self) -> float:
        """The fraction of the KV cells that requests in flight hold, as counted here: the
        prompts and tokens of the requests in the slots. Prefixes idle slots keep for
        reuse are not counted (a new request may take their cells, as vLLM's free
        cached blocks)."""
        cells = self.kv_cells()
        if not cells:
            return 0.0
        return min(1.0, sum(st.tokens for st in self.in_slots()[0]) / cells)

    def lora_in_flight(self) -> tuple[set[int], set[int]]:
        """The LoRA adapters (ids) the requests in the slots run under, and those of the
        requests waiting: a request's own nonzero scales, else the configured ones'."""
        configured = {a["id"]: a["scale"] for a in self.info.get("lora") or ()}

        def used(streams: list[RequestStream]) -> set[int]:
            return {i for st in streams for i, scale in (st.lora or configured).items() if scale}

        running, waiting = self.in_slots()
        return used(running), used(waiting)


def engine_command(
    model: str,
    *,
    site: str,
    env: Mapping[str, str],
    n_ctx: int,
    parallel: int | str,
    n_batch: int,
    threads: int | None,
    n_gpu_layers: int,
    flash_attn: bool | None,
    backend: str,
    spec_k: int = SpeculativeConfig().k,
    draft_model: str | None = None,
    spec_threshold: float = SpeculativeConfig().threshold,
    spec_adaptive: bool = SpeculativeConfig().adaptive,
    prompt_cache_mib: int = EngineConfig().prompt_cache_mib,
    split_mode: str = EngineConfig().split_mode,
    tensor_split: Sequence[float] | None = None,
    main_gpu: int = EngineConfig().main_gpu,
    cache_types: tuple[str, str] = (EngineConfig().cache_type_k, EngineConfig().cache_type_v),
    loras: Sequence[tuple[str, float]] = (),
    mmproj: str | None = None,
    device_sampling: bool | None = None,
) -> EngineCommand:
    """The argv and environment that run the engine on a backend's build at ``site``
    (what is not given: the configuration's defaults)."""
    argv = [sys.executable, "-m", "strata_core.engine", "--model", model, "--backend", backend]
    argv += ["--n-ctx", str(n_ctx), "--parallel", str(parallel), "--n-batch", str(n_batch)]
    argv += ["--n-gpu-layers", str(n_gpu_layers), "--spec-k", str(spec_k)]
    if not spec_adaptive:
        argv += ["--spec-fixed"]
    argv += ["--prompt-cache-mib", str(prompt_cache_mib)]
    if draft_model:
        argv += ["--draft-model", draft_model, "--spec-threshold", repr(spec_threshold)]
    argv += ["--flash-attn", {True: "on", False: "off", None: "auto"}[flash_attn]]
    argv += ["--device-sampling", {True: "on", False: "off", None: "auto"}[device_sampling]]
    if threads:
        argv += ["--threads", str(threads)]
    argv += ["--split-mode", split_mode, "--main-gpu", str(main_gpu)]
    if tensor_split:
        argv += ["--tensor-split", ",".join(repr(float(x)) for x in tensor_split)]
    argv += ["--cache-type-k", cache_types[0], "--cache-type-v", cache_types[1]]
    for path, scale in loras:
        argv += ["--lora", path, "--lora-scale", repr(float(scale))]
    if mmproj:
        argv += ["--mmproj", mmproj]
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (site, here, os.environ.get("PYTHONPATH", "")) if p)
    full_env = dict(env)
    full_env["PYTHONPATH"] = path
    full_env.setdefault("PYTHONUNBUFFERED", "0")
    return EngineCommand(argv, full_env)
