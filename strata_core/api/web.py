"""The web page and the one route its server view reads.

``/`` serves the page (``strata_core/web/``: hand-written HTML, JavaScript and CSS shipped
in the package, nothing fetched at run time): a chat over the server's own API and a view
of what the engine is doing. ``GET /v1/strata/status`` is that view's feed: per model its
slots, queue, caches, speculation and restarts, read from the figures ``/metrics`` exports,
and a few minutes' history of tokens/s and time to first token sampled in the background.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException

from strata_core.api import ollama
from strata_core.api.pool import Loaded, ModelPool
from strata_core.api.service import Service

#: The page's files, served by name from one flat folder.
PAGE_DIR = Path(__file__).resolve().parents[1] / "web"
MEDIA_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}

#: Seconds between two history samples, and how many are kept (five minutes).
SAMPLE_EVERY = 2.0
SAMPLES = 150

router = APIRouter()
assets = APIRouter(include_in_schema=False)


def add_web_routes(app: FastAPI, web_ui: bool) -> None:
    """The status route and ``/`` (before the API families: Ollama's clients look at ``/``
    too), and the page's files with ``[server] web_ui``."""
    app.state.web_ui = web_ui
    app.include_router(router)
    if web_ui:
        app.include_router(assets)


@router.get("/", include_in_schema=False)
async def index(request: Request) -> Response:
    """The page for a browser (with ``web_ui``; else 404); Ollama's answer for its clients,
    which ask for no HTML."""
    if "text/html" not in request.headers.get("accept", ""):
        return PlainTextResponse(ollama.ROOT_TEXT)
    if not request.app.state.web_ui:
        raise HTTPException(404, "Not Found")
    return page_file("index.html")


@assets.get("/web/{name}")
async def asset(name: str) -> FileResponse:
    return page_file(name)


def page_file(name: str) -> FileResponse:
    path = PAGE_DIR / name
    # only the folder's own files, by plain name: no path ever leaves it
    if "/" in name or name.startswith(".") or path.suffix not in MEDIA_TYPES or not path.is_file():
        raise HTTPException(404, "Not Found")
    return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers={"cache-control": "no-cache"})


@dataclass(frozen=True)
class Sample:
    """One model's running totals at one moment (the history is their differences)."""

    t: float
    emitted: int
    ttft_sum: float
    ttft_count: int
    busy: int
    queue: int


def sample(service: Service, t: float) -> Sample:
    m = service.metrics
    return Sample(t, service.engine.emitted, m.ttft.sum, sum(m.ttft.counts), int(m.busy_slots()),
                  int(m.queue_depth()))  # fmt: skip


class History:
    """Samples of every loaded model every ``SAMPLE_EVERY`` seconds, the last ``SAMPLES``
    kept; a model loaded again (a new Service, counts from zero) starts a new history."""

    def __init__(self, pool: ModelPool) -> None:
        self.pool = pool
        self.samples: dict[str, collections.deque[Sample]] = {}
        self.owner: dict[str, Service] = {}
        self.task: asyncio.Task[None] | None = None

    def watch(self) -> None:
        """Start sampling (on the first status request: a server nobody looks at pays nothing)."""
        if self.task is None:
            self.record()
            self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(SAMPLE_EVERY)
            self.record()

    def record(self) -> None:
        now = time.time()
        for name, m in self.pool.models.items():
            if m.service is None or not m.service.engine.ready.is_set():
                continue
            if self.owner.get(name) is not m.service:
                self.owner[name], self.samples[name] = m.service, collections.deque(maxlen=SAMPLES)
            self.samples[name].append(sample(m.service, now))

    def points(self, name: str) -> list[dict[str, Any]]:
        """Per interval: its end, tokens/s, mean TTFT of the requests that started (None: none did)."""
        s = list(self.samples.get(name, ()))
        out = []
        for a, b in itertools.pairwise(s):
            dt, firsts = b.t - a.t, b.ttft_count - a.ttft_count
            ttft = (b.ttft_sum - a.ttft_sum) / firsts if firsts > 0 else None
            out.append({"t": round(b.t, 3), "tokens_per_s": round(max(0, b.emitted - a.emitted) / dt, 2),
                        "ttft_s": None if ttft is None else round(ttft, 4), "busy": b.busy, "queue": b.queue})  # fmt: skip
        return out


@router.get("/v1/strata/status")
async def status(request: Request) -> dict[str, Any]:
    """Every model's slots, queue, KV and prompt cache, speculation, restarts and the last
    minutes of tokens/s and TTFT: what the web page's server view shows."""
    app = request.app
    pool: ModelPool = app.state.pool
    history = getattr(app.state, "web_history", None)
    if history is None:
        history = app.state.web_history = History(pool)
    history.watch()
    models = [model_status(name, m, history.points(name)) for name, m in list(pool.models.items())]
    return {"object": "strata.status", "time": time.time(), "sample_every_s": SAMPLE_EVERY, "models": models}


def model_status(name: str, m: Loaded, history: list[dict[str, Any]]) -> dict[str, Any]:
    head = {"name": name, "backend": m.spec.backend.name, "inputs": m.spec.inputs}
    service = m.service
    if service is None:  # loading holds the entry's lock until the engine is ready
        return {**head, "state": "loading" if m.lock.locked() else "not loaded"}
    engine, metrics, config = service.engine, service.metrics, service.config
    if not engine.ready.is_set():
        return {**head, "state": "starting", "restarts": engine.restarts}
    now, slots = time.monotonic(), service.slots
    running = engine.in_slots()[0]
    rows = [{"slot": i, "busy": True, "prompt_tokens": st.prompt, "generated": st.tokens - st.prompt,
             "seconds": round(now - st.started, 2)} for i, st in enumerate(running)]  # fmt: skip
    rows += [{"slot": i, "busy": False} for i in range(len(running), slots)]
    prompt, cached = metrics.prompt_tokens.get(), metrics.cached_tokens.get()
    drafted, accepted = metrics.spec_drafted.get(), metrics.spec_accepted.get()
    kv = engine.info.get("kv_cache") or {}
    return {
        **head, "state": "ready", "restarts": engine.restarts, "n_ctx": service.n_ctx,
        "slots": rows, "busy": int(metrics.busy_slots()), "queue": int(metrics.queue_depth()),
        "kv_cache": {"usage": round(metrics.kv_usage(), 4),
                     "type_k": kv.get("type_k"), "type_v": kv.get("type_v"), "bytes_per_slot": kv.get("bytes_per_slot")},
        "prompt_cache": {"prompt_tokens": prompt, "cached_tokens": cached,
                         "hit_rate": round(cached / prompt, 4) if prompt else None,
                         "host_mib": config.engine.prompt_cache_mib},
        "speculation": {"mode": config.speculative.mode, "drafted": drafted, "accepted": accepted,
                        "acceptance": round(accepted / drafted, 4) if drafted else None},
        "requests": {"total": metrics.requests.get(), "errors": metrics.errors.get(),
                     "cancelled": metrics.cancelled.get(), "refused": metrics.refused.get()},
        "tokens_generated": metrics.gen_tokens.get(),
        "history": history,
    }  # fmt: skip
