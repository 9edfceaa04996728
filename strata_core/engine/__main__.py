"""The engine process: ``python -m strata_core.engine --model PATH ...``.

Commands arrive on stdin, events leave on stdout, one line each (see protocol.py);
logs go to stderr. A reader thread parses stdin into a queue; the main thread runs
scheduler steps and drains the queue between them.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import os
import queue
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from strata_core import protocol as proto

CAPABILITIES = [
    "logprobs", "logprobs_mode", "allowed", "bias", "penalties", "seed", "prefix_cache", "grammar",
]  # fmt: skip
"""What READY lists: the GEN options (strata_core/options.py) this engine acts on, besides
``max_tokens``, ``stop_ids``, ``spec`` and ``isolate``; ``spec_draft`` is added when a draft
model was loaded, ``embeddings`` (EMBED) unless the model is a ranker."""


class Output:
    """Collects event lines and writes them in one flush per step."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.lock = threading.Lock()

    def emit(self, ev: proto.Event) -> None:
        """Queue an event for the next flush (main thread only)."""
        self.lines.append(proto.encode_event(ev) + "\n")

    def flush(self) -> None:
        if self.lines:
            with self.lock:
                sys.stdout.write("".join(self.lines))
                sys.stdout.flush()
            self.lines.clear()

    def write_now(self, ev: proto.Event) -> None:
        """Write one event at once, from any thread, between the main thread's flushes."""
        with self.lock:
            sys.stdout.write(proto.encode_event(ev) + "\n")
            sys.stdout.flush()


TRACE_ENV = "STRATA_STEP_TRACE"
"""A file to append one JSON line per scheduler step to: decoding slots, rows,
micro-batches, windows, tokens emitted and where the step's milliseconds went
(docs/backends/cuda.md)."""


def step_trace(path: str | None) -> Callable[[dict[str, Any]], None] | None:
    if not path:
        return None
    import atexit
    import json

    f = open(path, "a", buffering=1)  # line by line: a trace shows the last step even if the engine stalls
    atexit.register(f.close)

    def write(record: dict[str, Any]) -> None:
        f.write(json.dumps(record) + "\n")

    return write


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The engine's options; their defaults are the configuration's (config.py), so a
    default is written once."""
    from strata_core.config import SPLIT_MODES, EngineConfig, SpeculativeConfig

    eng, spec = EngineConfig(), SpeculativeConfig()
    ap = argparse.ArgumentParser(prog="python -m strata_core.engine")
    ap.add_argument("--model", required=True)
    ap.add_argument("--n-ctx", type=int, default=eng.n_ctx, help="context per slot")
    ap.add_argument("--parallel", type=int, default=eng.parallel)
    ap.add_argument("--n-batch", type=int, default=eng.n_batch)
    ap.add_argument("--threads", type=int, default=eng.threads)
    ap.add_argument("--n-gpu-layers", type=int, default=0)
    ap.add_argument("--flash-attn", choices=["on", "off", "auto"], default="auto")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--split-mode", choices=SPLIT_MODES, default=eng.split_mode, help="how the model spreads over GPUs")
    ap.add_argument("--tensor-split", type=_proportions, help="each GPU's share, e.g. 3,1")
    ap.add_argument("--main-gpu", type=int, default=eng.main_gpu, help="the GPU for split mode none")
    ap.add_argument("--prompt-cache-mib", type=int, default=eng.prompt_cache_mib,
                    help="host memory for saved slot caches")  # fmt: skip
    ap.add_argument("--spec-k", type=int, default=spec.k, help="most tokens a speculative window proposes")
    ap.add_argument("--spec-fixed", action="store_true", default=not spec.adaptive,
                    help="n-gram windows at every match, not only where they pay")  # fmt: skip
    ap.add_argument("--draft-model", help="a GGUF sharing the model's vocabulary, for spec=draft")
    ap.add_argument("--mmproj", help="the model's multimodal projector GGUF (images, audio)")
    ap.add_argument("--spec-threshold", type=float, default=spec.threshold, help="the draft model's confidence gate")
    return ap.parse_args(argv)


def _proportions(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def stdin_reader(q: queue.Queue[Any], answer_now: Callable[[Any], bool]) -> None:
    """Parse stdin into ``q``; commands ``answer_now`` takes are answered on this thread."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            cmd = proto.parse_command(line)
        except proto.ProtocolError as exc:
            q.put(exc)
            continue
        if not answer_now(cmd):
            q.put(cmd)
    q.put(proto.Quit())


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
    from strata_core.engine.media import placeholder

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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack to stderr
    # Imported here so --help works without a native build on the path.
    # llama.py first: libllama's native libraries must load before numpy's. The other
    # order made model loading segfault with CUDA 13 and numpy 2.5 on an H200.
    from strata_core.engine.llama import Llama, ModelOptions  # isort: skip
    from strata_core.config import check_split, split_settings
    from strata_core.engine.drafter import DraftModel, check_shared_vocab
    from strata_core.engine.grammar import Grammars
    from strata_core.engine.scheduler import Request, Scheduler
    from strata_core.options import GenOptions

    out = Output()
    drafter = None
    try:
        flash_attn = {"on": True, "off": False}.get(args.flash_attn)
        # The configuration's own rules, for an engine started by any client.
        split = split_settings(args.split_mode, args.tensor_split, args.main_gpu)
        check_split(split.split_mode, flash_attn, args.n_gpu_layers)
        opts = ModelOptions(
            path=args.model,
            n_ctx=args.n_ctx,
            n_seq=args.parallel,
            n_batch=args.n_batch,
            threads=args.threads,
            n_gpu_layers=args.n_gpu_layers,
            flash_attn=flash_attn,
            split_mode=split.split_mode,
            tensor_split=tuple(split.tensor_split or ()),
            main_gpu=split.main_gpu,
        )
        llama = Llama(opts)
        if args.draft_model:
            draft = Llama(dataclasses.replace(opts, path=args.draft_model))
            check_shared_vocab(llama, draft, args.draft_model)
            draft.warm_up()
            drafter = DraftModel(draft, args.spec_threshold)
        llama.warm_up()
        projector = None
        if args.mmproj:
            from strata_core.engine.media import Projector

            projector = Projector(args.mmproj, llama, args.threads or len(os.sched_getaffinity(0)))
    except Exception as exc:
        out.emit(proto.Error(None, f"engine failed to start: {exc}"))
        out.flush()
        return 1
    import llama_cpp
    import numpy as np

    facts = llama.facts()
    eog = frozenset(facts["eog"])
    out.emit(
        proto.Ready(
            {
                "protocol": proto.PROTOCOL_VERSION,
                "engine": "strata",
                "llama_cpp_python": llama_cpp.__version__,
                "backend": args.backend,
                "pid": os.getpid(),
                "slots": args.parallel,
                "n_batch": llama.n_batch,
                "split": llama.split,
                "capabilities": CAPABILITIES + (["spec_draft"] if drafter else [])
                + (["embeddings"] if llama.pooling != "rank" else []),
                "inputs": projector.inputs if projector else ["text"],
                **facts,
            }
        )
    )
    out.flush()
    sched = Scheduler(
        llama, out.emit, drafter, adaptive=not args.spec_fixed, saved_bytes=args.prompt_cache_mib << 20,
        shape_costs=llama.on_gpu, trace=step_trace(os.environ.get(TRACE_ENV)),
    )  # fmt: skip
    grammars = Grammars(lambda: llama.grammar_tokenizer(sorted(eog)), llama.n_vocab)
    warned: set[str] = set()

    def start(cmd: proto.Gen) -> None:
        def fail(msg: str) -> None:
            out.emit(proto.Error(cmd.rid, msg))
            out.emit(proto.Done(cmd.rid, "error", {}))

        for key in GenOptions.unknown({k: v for k, v in cmd.keys.items() if k != "media"}):
            if key not in warned:
                warned.add(key)
                out.emit(proto.Warn(cmd.rid, f"unknown key {key}"))
        keys = dict(cmd.keys)
        media_field = keys.pop("media", None)
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
                media = place_media(prompt, proto.parse_spans(media_field), projector)
            except (ValueError, proto.ProtocolError) as exc:
                return fail(str(exc))
        try:
            opts = GenOptions.decode(keys)
            opts.check(llama.n_vocab)
            if opts.spec == "draft" and drafter is None:
                raise ValueError("spec=draft needs a draft model: start the engine with --draft-model PATH")
            grammar = grammars.matcher(opts.grammar) if opts.grammar is not None else None
        except ValueError as exc:
            return fail(str(exc))
        sched.submit(
            Request(cmd.rid, prompt, opts.sampling, opts.max_tokens or llama.n_ctx, frozenset(opts.stop_ids) | eog,
                    opts.logprobs, logprobs_processed=opts.logprobs_mode == "processed", grammar=grammar,
                    spec_k=args.spec_k if opts.spec != "off" and not media else 0,
                    spec_draft=opts.spec == "draft" and not media, isolate=opts.isolate, media=media)
        )  # fmt: skip

    def embed(cmd: proto.Embed) -> None:
        """One input's embedding, between two scheduler steps (on the main thread, the only
        one that decodes: the embeddings context shares the model and the cores)."""
        bad = [t for t in cmd.ids if t >= llama.n_vocab]
        if bad:
            out.emit(proto.Error(cmd.rid, f"token {bad[0]} is outside the vocabulary (n_vocab {llama.n_vocab})"))
            return
        try:
            vector = llama.embed(list(cmd.ids))
        except Exception as exc:  # an input too long, no memory for the context: this request's error
            out.emit(proto.Error(cmd.rid, f"embedding failed: {exc}"))
            return
        if not np.isfinite(vector).all():
            out.emit(proto.Error(cmd.rid, "the model's embedding is not finite"))
            return
        out.emit(proto.Embedding(cmd.rid, tuple(vector.tolist())))

    def handle(cmd: Any) -> bool:
        """Apply one command; False once QUIT was seen."""
        if isinstance(cmd, proto.ProtocolError):
            out.emit(proto.Error(None, str(cmd)))
        elif isinstance(cmd, proto.Gen):
            start(cmd)
        elif isinstance(cmd, proto.Cancel):
            sched.cancel(cmd.rid)
        elif isinstance(cmd, proto.Embed):
            embed(cmd)
        elif isinstance(cmd, proto.VocabRequest):
            pieces = tuple(llama.piece(t) for t in range(llama.n_vocab))
            out.emit(proto.Vocab(cmd.rid, pieces))
        elif isinstance(cmd, proto.Quit):
            return False
        return True

    q: queue.Queue[Any] = queue.Queue()
    def answer_now(cmd: Any) -> bool:
        """TOKENIZE is answered by the reader thread at once, even while a step decodes:
        it reads only the vocabulary, and a new request's prompt must not wait behind the
        prefill of the one before it. So is MTOKENIZE (media decoded and preprocessed by
        mtmd, as llama-server does on its HTTP threads)."""
        if isinstance(cmd, proto.MediaTokenize):
            out.write_now(media_tokens(cmd, projector))
            return True
        if not isinstance(cmd, proto.Tokenize):
            return False
        ids = llama.tokenize(cmd.text.encode("utf-8"), False, cmd.special)
        out.write_now(proto.Tokens(cmd.rid, tuple(ids)))
        return True

    threading.Thread(target=stdin_reader, args=(q, answer_now), daemon=True).start()
    running = True
    while running or sched.busy:
        try:
            # Block only when there is nothing to decode; till a command comes, save the
            # free slots' caches one at a time, off the path of the requests to come.
            while not sched.busy and q.empty() and sched.save_idle():
                pass
            cmd = q.get(block=not sched.busy)
            running = handle(cmd) and running
            while True:
                running = handle(q.get_nowait()) and running
        except queue.Empty:
            pass
        try:
            sched.step()
        except Exception as exc:  # a failed decode ends the requests in it, not the engine
            traceback.print_exc()  # to the engine's log: why every request in flight failed
            for slot in sched.slots:
                if slot.req is not None:
                    out.emit(proto.Error(slot.req.rid, f"decode failed: {exc}"))
                    sched._finish(slot, "error")
                slot.cached = []
                llama.seq_trim(slot.seq, 0)
        out.flush()
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
