"""LoRA adapters while a model runs: a model's adapters by name (the configured ones and
those loaded since), and the routes that change them — vLLM's ``POST
/v1/load_lora_adapter`` / ``/v1/unload_lora_adapter`` (same bodies, status codes and
messages) and llama-server's ``POST /lora-adapters`` (the default scales).

An adapter's name is also a ``model`` a request may name: its base model runs it with that
adapter alone at scale 1 (vLLM's meaning). An adapter being unloaded takes no new request;
the unload waits for the requests running on it to finish. An adapter loaded at run time
lasts while its model's engine runs."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from strata_core.api.openapi import error_response
from strata_core.client.reader import EngineClient, EngineRefused
from strata_core.ops.adapters import AdapterMissing, check_adapter
from strata_core.ops.config import LoraAdapter
from strata_core.schema.errors import ApiError

router = APIRouter()

#: How often an unload looks whether the requests on its adapter have finished.
DRAIN_POLL_S = 0.05


class LoraAdapters:
    """One model's adapters by name; the engine holds them by id (``info["lora"]``)."""

    def __init__(self, engine: EngineClient, configured: Sequence[LoraAdapter], model: Path | None = None) -> None:
        self.engine, self.model = engine, model
        self.names: dict[int, str] = {i: a.label() for i, a in enumerate(configured)}
        self.draining: set[int] = set()
        self.lock = asyncio.Lock()  # one change at a time

    def listing(self) -> list[dict[str, Any]]:
        """llama-server's list (id, path, scale) with each adapter's name; one being
        unloaded is left out."""
        return [{"id": a["id"], "name": self.names.get(a["id"], Path(a["path"]).stem), "path": a["path"],
                 "scale": a["scale"]} for a in self.engine.info.get("lora") or () if a["id"] not in self.draining]  # fmt: skip

    def id_of(self, name: str | None) -> int | None:
        return next((a["id"] for a in self.listing() if a["name"] == name), None)

    def usable(self) -> set[int]:
        return {a["id"] for a in self.listing()}

    async def load(self, name: str, path: str) -> None:
        async with self.lock:
            if self.id_of(name) is not None or name in {self.names.get(i) for i in self.draining}:
                raise vllm_error(400, f"The lora adapter '{name}' has already been loaded.", "InvalidUserInput")
            try:
                if self.model is not None:
                    check_adapter(Path(path), self.model)
                await self.engine.lora("load", path)
            except AdapterMissing as exc:
                raise vllm_error(404, str(exc), "NotFoundError") from None
            except (ValueError, EngineRefused) as exc:
                raise vllm_error(400, str(exc), "BadRequestError") from None
            self.names[max(a["id"] for a in self.engine.info["lora"])] = name

    async def unload(self, name: str) -> None:
        """Take no new request on it, wait for those on it to finish, then unload it."""
        async with self.lock:
            i = self.id_of(name)
            if i is None:
                raise vllm_error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
            self.draining.add(i)
            try:
                while any(i in ids for ids in self.engine.lora_in_flight()):
                    await asyncio.sleep(DRAIN_POLL_S)
                await self.engine.lora("unload", i)
            except EngineRefused as exc:
                raise vllm_error(400, str(exc), "BadRequestError") from None
            finally:
                self.draining.discard(i)
            self.names.pop(i, None)

    async def set_scales(self, scales: dict[int, float]) -> None:
        """New default scales (an adapter left out: 0); requests running keep theirs."""
        async with self.lock:
            unknown = sorted(set(scales) - self.usable())
            if unknown:
                raise ApiError(400, f"no LoRA adapter has id {unknown[0]} (GET /lora-adapters lists them)",
                               param="id", code="invalid_value")  # fmt: skip
            try:
                await self.engine.lora("scales", scales)
            except EngineRefused as exc:
                raise ApiError(400, str(exc), param="id", code="invalid_value") from None


def vllm_error(status: int, message: str, kind: str) -> ApiError:
    """An error as vLLM's adapter routes give it: their message and type, the status."""
    return ApiError(status, message, type=kind, code=str(status))


class LoadAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str | None = None
    lora_path: str | None = None
    load_inplace: bool = False  # vLLM's: replace an adapter of that name (not supported here)
    model: str | None = None  # Strata's: the base model (None: the first)


class UnloadAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str | None = None
    lora_int_id: int | None = None
    model: str | None = None


class Scale(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: int = Field(ge=0)
    scale: float = Field(allow_inf_nan=False)


#: What the load and unload routes answer besides their reply.
MANAGING: dict[int | str, dict[str, Any]] = {
    400: error_response("a body without the adapter's name (or path), an adapter that does not fit the model, a name loaded"),
    403: error_response("loading adapters at run time is off ([server] lora_loading = false)"),
    404: error_response("no file at lora_path, no adapter of that name, or no such model"),
}


def check_loading(request: Request) -> None:
    if not request.app.state.server_config.lora_loading:
        raise ApiError(403, "loading LoRA adapters at run time is off on this server: it reads files by the "
                       "paths clients send (set [server] lora_loading = true)", type="permission_error",
                       code="lora_loading_off")  # fmt: skip


async def adapters_of(request: Request, model: str | None) -> LoraAdapters:
    """The adapters of the model named (loaded now if it is not)."""
    service = await request.app.state.pool.service(model)
    return service.adapters  # type: ignore[no-any-return]


@router.post("/v1/load_lora_adapter", response_class=PlainTextResponse, responses=MANAGING)
async def load_lora_adapter(body: LoadAdapter, request: Request) -> str:
    check_loading(request)
    if not body.lora_name or not body.lora_path:
        raise vllm_error(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
    if body.load_inplace:
        raise ApiError(400, "load_inplace is not supported: unload the adapter, then load it again",
                       param="load_inplace", code="unsupported_value")  # fmt: skip
    await (await adapters_of(request, body.model)).load(body.lora_name, body.lora_path)
    return f"Success: LoRA adapter '{body.lora_name}' added successfully."


@router.post("/v1/unload_lora_adapter", response_class=PlainTextResponse, responses=MANAGING)
async def unload_lora_adapter(body: UnloadAdapter, request: Request) -> str:
    check_loading(request)
    if not body.lora_name and body.lora_int_id is None:
        raise vllm_error(400, "either 'lora_name' and 'lora_int_id' needs to be provided.", "InvalidUserInput")
    adapters = await adapters_of(request, body.model)
    name = body.lora_name
    if not name:  # by id: the engine's, as GET /lora-adapters lists it
        name = next((a["name"] for a in adapters.listing() if a["id"] == body.lora_int_id), str(body.lora_int_id))
    await adapters.unload(name)
    return f"Success: LoRA adapter '{name}' removed successfully."


@router.post("/lora-adapters", responses={400: error_response("an id no adapter has"), 404: error_response("no such model")})
async def set_lora_scales(body: list[Scale], request: Request, model: str | None = None) -> dict[str, bool]:
    """llama-server's: every adapter's default scale (one left out: 0), what a request
    without ``lora`` of its own gets from now on."""
    scales = {s.id: s.scale for s in body}
    await (await adapters_of(request, model)).set_scales(scales)
    return {"success": True}
