"""llama-server's router API over the model pool, for configured and catalog models:
``GET /models`` (each model's status: loaded, loading, unloaded, sleeping, downloading; a
failed load is ``unloaded`` with ``failed`` and its ``reason``), ``POST /models/load`` and
``/models/unload``, ``GET /models/sse`` (the pool's events), ``POST /models`` (a download
from the hub, in the background; its progress on the events and in ``GET /models``) and
``DELETE /models?model=``. Errors are OpenAI's shape, as llama-server's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import Field

from strata_core.api import downloads, openapi
from strata_core.api.bodies import sse
from strata_core.api.pool import Loaded, ModelPool, status_data
from strata_core.api.service import json_body
from strata_core.api.status import model_card, pool_of
from strata_core.ops import catalog
from strata_core.schema.errors import ApiError
from strata_core.schema.requests import Strict, parse_request

router = APIRouter()

SUCCESS = {"success": True}
_SUCCESS = {"type": "object", "required": ["success"], "properties": {"success": {"const": True}}}
_LIST = {"type": "object", "required": ["object", "data"],
         "properties": {"data": {"type": "array", "items": {"type": "object", "required": ["id", "status"]}}}}  # fmt: skip
#: What changing the hub's cache may answer besides (downloads.check_managed, downloads.pull_error).
_MANAGING: dict[int | str, dict[str, Any]] = {403: openapi.error_response("model management is off ([server] catalog = false)"),
             502: openapi.error_response("the hub cannot be reached, or sent what was refused")}  # fmt: skip


class ModelName(Strict):
    """The body of ``POST /models``, ``/models/load`` and ``/models/unload``."""

    model: str = Field(min_length=1)


def documented(what: str, managing: bool = False) -> dict[str, Any]:
    """A route's OpenAPI details: ``ModelName`` as its body, ``{"success": true}`` its reply."""
    details = openapi.route(ModelName, what, _SUCCESS, stream=False)
    if managing:
        details["responses"].update(_MANAGING)
    return details


def downloads_of(request: Request) -> downloads.Downloads:
    state = request.app.state
    if not hasattr(state, "downloads"):
        state.downloads = downloads.Downloads(pool_of(request))
    return state.downloads  # type: ignore[no-any-return]


def model_row(pool: ModelPool, name: str, m: Loaded) -> dict[str, Any]:
    """One model as llama-server's ``GET /models`` lists it (with /v1/models' fields)."""
    status = status_data(m)
    status = {"value": status.pop("status"), "args": m.spec.command.argv, **status}
    configured = pool.configured(name)
    return {**model_card(name, m), "aliases": sorted(m.spec.aliases), "path": str(m.spec.path), "status": status,
            "architecture": {"input_modalities": m.spec.inputs, "output_modalities": ["text"]},
            "source": "config" if configured else "cache", "can_remove": not configured}  # fmt: skip


def download_row(name: str, progress: dict[str, dict[str, int]]) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "strata",
            "status": {"value": "downloading", "progress": progress}, "source": "cache", "can_remove": False}  # fmt: skip


@router.get("/models", responses={200: {"description": "every model and its status",
                                         "content": {"application/json": {"schema": _LIST}}}})  # fmt: skip
async def models(request: Request, reload: str | None = None) -> dict[str, Any]:
    """Every model and its status (the catalog is read again each time; ``reload`` is
    taken for llama-server's clients and changes nothing more)."""
    pool = pool_of(request)
    rows = [model_row(pool, name, pool.models[name]) for name in pool.names()]
    rows += [download_row(n, dict(p)) for n, p in downloads_of(request).progress.items() if n not in pool.models]
    return {"object": "list", "data": rows}


@router.post("/models/load", **documented("a model's load, started"))
async def load(request: Request) -> dict[str, Any]:
    """Start loading a model (or waking a sleeping one) and answer at once; its progress
    is its status. 400 when it is already loaded or loading."""
    pool = pool_of(request)
    m = pool.entry(parse_request(ModelName, await json_body(request)).model)
    if m.state in ("loading", "loaded"):
        raise ApiError(400, f"the model {m.spec.name!r} is already running ({m.state})", param="model",
                       code="model_running")  # fmt: skip
    pool.load_soon(m.spec.name)
    return SUCCESS


@router.post("/models/unload", **documented("a model's engine, stopped"))
async def unload(request: Request) -> dict[str, Any]:
    """Stop a model's engine once its running requests finish (a loading one once it is
    loaded; a sleeping one is only marked unloaded), or its download; 400 when it is not
    running."""
    pool = pool_of(request)
    name = parse_request(ModelName, await json_body(request)).model
    if downloads_of(request).stop(name):
        return SUCCESS  # a download stopped (llama-server's way to cancel one); the next pull resumes it
    m = pool.entry(name)
    if not await pool.unload(m.spec.name):
        raise ApiError(400, f"the model {m.spec.name!r} is not running ({m.state})", param="model",
                       code="model_not_running")  # fmt: skip
    return SUCCESS


@router.get("/models/sse", include_in_schema=False)  # an endless stream: docs/models.md describes it
async def events(request: Request) -> StreamingResponse:
    """The pool's events, one ``data:`` line each, as they happen (from this request on)."""
    pool = pool_of(request)
    queue = pool.events.subscribe()  # before the reply starts: no event after it is missed

    async def stream() -> AsyncIterator[bytes]:
        try:
            yield b": subscribed\n\n"
            while (ev := await queue.get()) is not None:
                yield sse(ev)
        finally:
            pool.events.unsubscribe(queue)

    return StreamingResponse(stream(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


@router.post("/models", **documented("a model's download, started", managing=True))
async def download(request: Request) -> dict[str, Any]:
    """Download a model from the hub in the background (``[server] catalog`` on): the
    reference is checked against the hub's listing first (400 malformed, 404 not there,
    502 hub unreachable); 400 when it is already here or downloading."""
    pool = pool_of(request)
    name = parse_request(ModelName, await json_body(request)).model
    downloads.check_managed(pool, "downloading models")
    planned = await downloads.plan(downloads.hub_ref(name))
    pool.refresh()
    there = downloads_of(request)
    if planned.name in pool.models or planned.name in there.progress:
        raise ApiError(400, f"the model {planned.name!r} already exists", param="model", code="model_exists")
    there.begin(planned)
    return SUCCESS


@router.delete("/models", responses={200: {"description": "the model removed",
                                            "content": {"application/json": {"schema": _SUCCESS}}},
                                      400: openapi.error_response("no model named, or a configured one"),
                                      **_MANAGING})  # fmt: skip
async def delete(request: Request, model: str | None = None) -> dict[str, Any]:
    """Remove a catalog model's files from the hub's cache (its engine stopped first); a
    configured model is not removable (400)."""
    if not model:
        raise ApiError(400, "DELETE /models needs the model's name in the query: ?model=NAME", param="model",
                       code="missing_required_parameter")  # fmt: skip
    pool = pool_of(request)
    downloads.check_managed(pool, "deleting models")
    local = catalog.find(model)
    if local is None:
        name = pool.entry(model).spec.name  # 404 for a name nothing serves
        raise ApiError(400, f"the model {name!r} is not removable: it is configured, not from the hub's cache",
                       param="model", code="model_not_removable")  # fmt: skip
    if pool.configured_path(local.path):
        raise ApiError(400, f"the model {local.name!r} is not removable: a configured model uses its file",
                       param="model", code="model_not_removable")  # fmt: skip
    await pool.drop(local.name)
    catalog.remove(local)
    return SUCCESS
