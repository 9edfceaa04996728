"""The routes that say what the server serves and how it is doing: the models and their
LoRA adapters, health (readiness), the metrics, and the backend."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from strata_core.api.pool import ModelPool

router = APIRouter()


def pool_of(request: Request) -> ModelPool:
    return request.app.state.pool  # type: ignore[no-any-return]


def lora_adapters(entry: Any) -> list[dict[str, Any]]:
    """A pool entry's adapters in id order: its engine's, else (not loaded) the configured ones."""
    if entry.service is not None:
        return entry.service.adapters.listing()  # type: ignore[no-any-return]
    adapters = entry.spec.config.engine.lora
    return [{"id": i, "name": a.label(), "path": a.path, "scale": a.scale} for i, a in enumerate(adapters)]


def model_card(name: str, entry: Any) -> dict[str, Any]:
    """A served model as /v1/models lists it: the inputs it takes, its LoRA adapters, and
    (``strata``) its sampling defaults with where each came from."""
    adapters = lora_adapters(entry)
    defaults = entry.spec.defaults
    return {"id": name, "object": "model", "created": 0, "owned_by": "strata", "inputs": entry.spec.inputs,
            **({"lora_adapters": adapters} if adapters else {}),
            **({"strata": {"sampling_defaults": defaults.view()}} if defaults else {})}  # fmt: skip


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    pool = pool_of(request)
    cards = [model_card(name, pool.models[name]) for name in pool.names()]
    adapters = [{"id": a["name"], "object": "model", "created": 0, "owned_by": "strata", "root": a["path"],
                 "parent": card["id"]} for card in cards for a in card.get("lora_adapters", ())]  # vLLM's adapter cards
    return {"object": "list", "data": cards + adapters}


@router.get("/lora-adapters")
async def get_lora_adapters(request: Request, model: str | None = None) -> list[dict[str, Any]]:
    """The model's LoRA adapters (llama-server's shape, with their names): ``id`` is what
    a request's ``lora`` names, ``scale`` what a request without one gets."""
    return lora_adapters(pool_of(request).entry(model))


@router.get("/health", responses={503: {"description": "the engine is starting",
                                        "content": {"application/json": {"schema": {"type": "object"}}}}})  # fmt: skip
async def health(request: Request) -> JSONResponse:
    """ok when the engine of every loaded model is ready (the server answers only once
    the models that load with it are loaded)."""
    if all(s.engine.ready.is_set() for s in pool_of(request).loaded()):
        return JSONResponse({"status": "ok"})
    return JSONResponse({"status": "starting"}, status_code=503)


@router.get("/metrics", response_class=PlainTextResponse)
async def metrics(request: Request, model: str | None = None) -> PlainTextResponse:
    """The first model's series, or ``?model=NAME``'s (an unloaded model has none), and
    every model's state, loads and failed loads."""
    pool = pool_of(request)
    service = pool.entry(model).service
    text = (service.metrics.render() if service is not None else "") + pool.metrics.render()
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


@router.get("/v1/strata/backend")
async def backend(request: Request, model: str | None = None) -> dict[str, Any]:
    """The first model's backend, engine and restarts (or ``?model=NAME``'s), and
    every model's backend and whether it is loaded."""
    pool = pool_of(request)
    entry = pool.entry(model)
    service = entry.service
    engine = service.engine if service is not None else None
    info = {k: v for k, v in (engine.info if engine else {}).items() if k not in {"eog", "chat_template"}}
    every = {m.spec.name: {"backend": m.spec.backend.name, "loaded": m.service is not None, "inputs": m.spec.inputs}
             for m in pool.models.values()}  # fmt: skip
    # a Ray Serve replica says which one it is (strata_core/scale/replica.py)
    state = request.app.state
    replica = {"replica": state.replica} if hasattr(state, "replica") else {}
    return {**entry.spec.info(), "engine": info, "restarts": engine.restarts if engine else 0,
            "models": every, **replica}  # fmt: skip
