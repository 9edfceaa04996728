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

from strata_core.contract import protocol as proto

CAPABILITIES = [
    "logprobs", "logprobs_mode", "allowed", "bias", "penalties", "seed", "prefix_cache", "grammar", "think_budget",
]  # fmt: skip
"""What READY lists: the GEN options (strata_core/contract/options.py) this engine acts on, besides
``max_tokens``, ``stop_ids``, ``spec`` and ``isolate``; ``spec_draft`` is added when a draft
model was loaded, ``embeddings`` (EMBED) unless the model is a ranker, and then ``rerank``
(EMBED answers its classification head's output)."""


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
(python -m bench.speculation trace summarises it)."""


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
    """The engine's options; their defaults are the configuration's (ops/config.py), so a
    default is written once."""
    from strata_core.ops.config import CACHE_TYPES, SPLIT_MODES, EngineConfig, SpeculativeConfig

    eng, spec = EngineConfig(), SpeculativeConfig()
    ap = argparse.ArgumentParser(prog="python -m strata_core.engine")
    ap.add_argument("--model", required=True)
    ap.add_argument("--n-ctx", type=int, default=eng.n_ctx, help="context per slot")
    ap.add_argument("--parallel", type=_slots, default=eng.parallel, help='slots, or "auto": as many as the GPU holds')
    ap.add_argument("--n-batch", type=int, default=eng.n_batch)
    ap.add_argument("--threads", type=int, default=eng.threads)
    ap.add_argument("--n-gpu-layers", type=int, default=0)
    ap.add_argument("--flash-attn", choices=["on", "off", "auto"], default="auto")
    ap.add_argument("--device-sampling", choices=["on", "off", "auto"], default="auto",
                    help="greedy tokens picked in the decode (llama.cpp's backend sampling); auto: on a GPU")  # fmt: skip
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--split-mode", choices=SPLIT_MODES, default=eng.split_mode, help="how the model spreads over GPUs")
    ap.add_argument("--tensor-split", type=_proportions, help="each GPU's share, e.g. 3,1")
    ap.add_argument("--cache-type-k", choices=CACHE_TYPES, default=eng.cache_type_k, help="the KV cache's key type")
    ap.add_argument("--cache-type-v", choices=CACHE_TYPES, default=eng.cache_type_v, help="the KV cache's value type")
    ap.add_argument("--lora", action="append", default=[], help="a LoRA adapter GGUF (repeatable)")
    ap.add_argument("--lora-scale", action="append", type=float, default=[],
                    help="each --lora's default scale, in order (1.0 where left out)")  # fmt: skip
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


def _slots(text: str) -> int | str:
    from strata_core.ops.config import check_parallel

    try:
        return check_parallel(text)  # type: ignore[no-any-return]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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


def load(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The model (and the draft model and the projector, if any), warmed up; raises why it
    cannot start."""
    # Imported here so --help works without a native build on the path.
    # llama.py first: libllama's native libraries must load before numpy's. The other
    # order made model loading segfault with CUDA 13 and numpy 2.5
    # (bench/results/2026-12-03-cuda-h200-conformance-green.md).
    from strata_core.engine.llama import Llama, ModelOptions, ll  # isort: skip
    from strata_core.engine.speculation.drafter import DraftModel, check_shared_vocab
    from strata_core.ops.config import check_cache_types, check_split, split_settings

    if args.parallel == "auto":
        fit_parallel(args, ll)
    flash_attn = {"on": True, "off": False}.get(args.flash_attn)
    # The configuration's own rules, for an engine started by any client.
    split = split_settings(args.split_mode, args.tensor_split, args.main_gpu)
    check_split(split.split_mode, flash_attn, args.n_gpu_layers)
    check_cache_types(args.cache_type_k, args.cache_type_v, flash_attn, split.split_mode)
    loras = tuple((p, args.lora_scale[i] if i < len(args.lora_scale) else 1.0) for i, p in enumerate(args.lora))
    opts = ModelOptions(
        path=args.model, n_ctx=args.n_ctx, n_seq=args.parallel, n_batch=args.n_batch, threads=args.threads,
        n_gpu_layers=args.n_gpu_layers, flash_attn=flash_attn, split_mode=split.split_mode,
        tensor_split=tuple(split.tensor_split or ()), main_gpu=split.main_gpu,
        cache_types=(args.cache_type_k, args.cache_type_v), loras=loras,
        device_greedy={"on": True, "off": False}.get(args.device_sampling), outputs_per_seq=args.spec_k + 1,
    )  # fmt: skip
    llama, drafter = Llama(opts), None
    if args.draft_model:
        draft = Llama(dataclasses.replace(opts, path=args.draft_model, loras=(), device_greedy=False))
        check_shared_vocab(llama, draft, args.draft_model)
        draft.warm_up()
        drafter = DraftModel(draft, args.spec_threshold)
    llama.warm_up()
    projector = None
    if args.mmproj:
        from strata_core.engine.media import Projector

        projector = Projector(args.mmproj, llama, args.threads or len(os.sched_getaffinity(0)))
    return llama, drafter, projector


def fit_parallel(args: argparse.Namespace, ll: Any) -> None:
    """``--parallel auto``: the slots (and context per slot) the GPU's free memory holds
    (engine/fit.py), or CPU_PARALLEL without a GPU; said on stderr and in READY."""
    from strata_core.engine.fit import auto_slots, device_free_memory
    from strata_core.ops.config import CPU_PARALLEL

    ll.llama_backend_init()
    gpu = args.n_gpu_layers != 0 and bool(ll.llama_supports_gpu_offload())
    free = device_free_memory(os.path.dirname(ll._lib._name)) if gpu else None
    extra = os.path.getsize(args.draft_model) if args.draft_model else 0
    fit = auto_slots(args.model, args.n_ctx, min(args.n_batch, 512), free, extra, (args.cache_type_k, args.cache_type_v))
    args.parallel, args.n_ctx = (fit.slots, fit.n_ctx) if fit else (CPU_PARALLEL, args.n_ctx)
    args.fit = fit.describe() if fit else f"parallel auto: {CPU_PARALLEL} slots (no GPU)"
    print(args.fit, file=sys.stderr)


def ready(args: argparse.Namespace, llama: Any, drafter: Any, projector: Any) -> proto.Ready:
    import llama_cpp

    return proto.Ready(
        {
            "protocol": proto.PROTOCOL_VERSION,
            "engine": "strata",
            "llama_cpp_python": llama_cpp.__version__,
            "backend": args.backend,
            "pid": os.getpid(),
            "slots": args.parallel,
            **({"parallel_fit": args.fit} if getattr(args, "fit", None) else {}),
            "n_batch": llama.n_batch,
            "device_sampling": llama.device_greedy,
            "split": llama.split,
            "kv_cache": llama.kv_cache,
            "lora": [{"id": i, "path": llama.lora_paths[i], "scale": llama.lora_scales[i]} for i in llama.lora_loaded()],
            "capabilities": CAPABILITIES + (["spec_draft"] if drafter else [])
            + (["embeddings"] if llama.pooling != "rank" else ["rerank"]),
            "inputs": projector.inputs if projector else ["text"],
            **llama.facts(),
        }
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack to stderr
    out = Output()
    try:
        llama, drafter, projector = load(args)
    except Exception as exc:
        out.emit(proto.Error(None, f"engine failed to start: {exc}"))
        out.flush()
        return 1
    from strata_core.engine.commands import Commands
    from strata_core.engine.loop import Engine

    out.emit(ready(args, llama, drafter, projector))
    out.flush()
    engine = Engine(
        llama, out.emit, drafter, adaptive=not args.spec_fixed, saved_bytes=args.prompt_cache_mib << 20,
        shape_costs=llama.on_gpu, trace=step_trace(os.environ.get(TRACE_ENV)),
    )  # fmt: skip
    commands = Commands(llama, engine, out.emit, args.spec_k, drafter is not None, projector)
    q: queue.Queue[Any] = queue.Queue()
    threading.Thread(target=stdin_reader, args=(q, commands.answer_now(out.write_now)), daemon=True).start()
    running = True
    while running or engine.busy:
        try:
            # Block only when there is nothing to decode; till a command comes, save the
            # free slots' caches one at a time, off the path of the requests to come.
            while not engine.busy and q.empty() and engine.save_idle():
                pass
            running = commands.handle(q.get(block=not engine.busy)) and running
            while True:
                running = commands.handle(q.get_nowait()) and running
        except queue.Empty:
            pass
        commands.adapters.settle()  # new default LoRA scales, once the requests under the old ones end
        try:
            engine.step()
        except Exception as exc:  # a failed decode ends the requests in it, not the engine
            traceback.print_exc()  # to the engine's log: why every request in flight failed
            engine.fail_all(f"decode failed: {exc}")
        out.flush()
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
