"""The engine in this process, for the diagnostics that drive libllama and the scheduler
directly: the model loaded as the engine loads it, chat prompts tokenized with its
template, and waves of requests with speculation on and off in turn."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from bench.load import abba
from bench.speculation.workloads import WORKLOADS
from strata_core.ops.build import ensure_engine
from strata_core.ops.config import load_config
from strata_core.ops.models import resolve_model
from strata_core.ops.plugins import load_registry

if TYPE_CHECKING:
    from strata_core.engine.llama import Llama
    from strata_core.engine.loop import Engine
    from strata_core.engine.request import Request


def load_llama(backend_name: str, model: str, n_ctx: int, n_seq: int, warm_up: bool = True, **options: Any) -> Llama:
    """``model`` loaded on ``backend_name``'s engine build with the configuration's threads,
    the backend's default GPU layers and flash attention, and ``options`` (of
    ``ModelOptions``) over them."""
    backend = load_registry().get(backend_name)
    # The engine's libllama bindings live in its build, not in this environment; and they load
    # before numpy, as in the engine: the other order crashes model loading on CUDA.
    sys.path.insert(0, str(ensure_engine(backend).path))
    from strata_core.engine.llama import Llama, ModelOptions

    d = backend.engine_defaults()
    options = {"n_gpu_layers": d.n_gpu_layers, "flash_attn": d.flash_attn, **options}
    m = Llama(ModelOptions(path=str(resolve_model(model).path), n_ctx=n_ctx, n_seq=n_seq, n_batch=512,
                           threads=load_config().engine.threads, **options))  # fmt: skip
    if warm_up:
        m.warm_up()
    return m


def add_wave_args(ap: argparse.ArgumentParser, waves: int) -> None:
    """The options of a run of waves (``run_waves``)."""
    ap.add_argument("--model", default="default")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--waves", type=int, default=waves, help="waves of c requests per mode")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=7, help="most tokens one window proposes")
    ap.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))


@dataclass
class Wave:
    """One mode's turn: c requests served to the end."""

    workload: str
    c: int
    mode: str
    steps: list[dict[str, Any]]  # the scheduler's trace of the turn
    requests: list[Request]
    seconds: float  # by ``clock``


def run_waves(m: Llama, engine: Engine, steps: list[dict[str, Any]], a: argparse.Namespace,
              clock: Callable[[], float]) -> Iterator[Wave]:  # fmt: skip
    """For each workload and c of ``a``: ``a.waves`` waves of c greedy chat requests per mode,
    speculation off (``spec_k`` 0) and n-gram (``a.k``) taking turns in ABBA order, on an
    ``engine`` whose trace appends to ``steps``; each mode's turn as it ends."""
    from strata_core.contract.options import SamplingParams
    from strata_core.engine.request import Request
    from strata_core.text.chat import FALLBACK_TEMPLATE, ChatTemplate

    facts = m.facts()
    template = ChatTemplate(facts["chat_template"] or FALLBACK_TEMPLATE)
    eog = frozenset(facts["eog"])
    modes = {"off": 0, "ngram": a.k}
    for name in a.workloads:
        prompts = [m.tokenize(template.render([{"role": "user", "content": p}]).encode(), False, True)
                   for p in WORKLOADS[name]]  # fmt: skip
        for c in a.concurrency:
            for wave in range(a.waves):
                for mode in abba(list(modes), wave):
                    first = len(steps)
                    reqs = [Request(f"{mode}-{wave}-{i}", list(prompts[(wave * c + i) % len(prompts)]),
                                    SamplingParams(), a.max_tokens, eog, None, spec_k=modes[mode])
                            for i in range(c)]  # fmt: skip
                    for r in reqs:
                        engine.submit(r)
                    t0 = clock()
                    while engine.busy:
                        engine.step()
                    yield Wave(name, c, mode, steps[first:], reqs, clock() - t0)
