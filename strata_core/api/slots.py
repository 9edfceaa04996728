"""llama-server's slots: ``GET /slots`` (each slot's state) and ``POST /slots/{id}?action=
save|restore|erase`` (an idle slot's cache to a file in ``[server] slot_save_path``, back
from one, or dropped), in its shapes. A restored cache serves the next request whose
prompt starts with its tokens, as any slot's cache does (``cached_tokens``). ``?model=``
picks the model where the server serves several (the default model otherwise)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request

from strata_core.api.service import Service, engine_work, json_body, service_for
from strata_core.client.reader import EngineRefused
from strata_core.contract import protocol as proto
from strata_core.schema.errors import ApiError

router = APIRouter()

ACTIONS = ("save", "restore", "erase")
#: How often an action on a busy slot asks again (llama-server defers it the same way).
BUSY_POLL_S = 0.05


@router.get("/slots")
async def get_slots(request: Request, model: str | None = None, fail_on_no_slot: str | None = None) -> Any:
    service = await service_for(request, model)
    service.ready()
    slots = await engine_work(request, service, service.engine.slot("list"))
    if fail_on_no_slot and all(s["is_processing"] for s in slots):
        raise ApiError(503, "no slot available", type="unavailable_error", code="no_slot")
    return slots


# Not in the OpenAPI document: without a slot directory it answers llama-server's 501,
# which a client of the document (and the fuzzer, tests/test_fuzz.py) takes for a fault.
@router.post("/slots/{id_slot}", include_in_schema=False)
async def post_slot(request: Request, id_slot: str, action: str | None = None, model: str | None = None) -> Any:
    folder = request.app.state.server_config.slot_save_path
    if not folder:
        raise ApiError(501, "this server does not save slots: set [server] slot_save_path (a directory)",
                       type="not_supported_error", code="not_supported")  # fmt: skip
    if not id_slot.isascii() or not id_slot.isdigit():
        raise ApiError(400, f"invalid slot id {id_slot[:20]!r}: expected a slot number (GET /slots lists them)",
                       param="id_slot", code="invalid_value")  # fmt: skip
    if action not in ACTIONS:
        raise ApiError(400, f"invalid action {action!r}: expected one of {', '.join(ACTIONS)}", param="action",
                       code="invalid_value")  # fmt: skip
    path = ""
    if action != "erase":
        body = await json_body(request)
        path = str(slot_file(Path(folder), body.get("filename") if isinstance(body, dict) else None))
    service = await service_for(request, model)
    service.ready()
    if int(id_slot) >= service.slots:
        raise ApiError(400, f"invalid slot id {id_slot}: this model has slots 0..{service.slots - 1}",
                       param="id_slot", code="invalid_value")  # fmt: skip
    return await engine_work(request, service, act(service, action, int(id_slot), path))


async def act(service: Service, action: str, slot: int, path: str) -> Any:
    """The engine's answer to the action, asked again while the slot is busy; 400 for a
    file it refuses (none of that name, a file of another model, one it cannot write)."""
    while True:
        try:
            return await service.engine.slot(action, slot, path)
        except EngineRefused as exc:
            if not str(exc).startswith(proto.SLOT_BUSY):
                raise ApiError(400, str(exc), param="filename", code="invalid_value") from None
        await asyncio.sleep(BUSY_POLL_S)


def slot_file(folder: Path, name: Any) -> Path:
    """``name``'s path in ``folder``: a plain file name, never a path out of it."""
    if not isinstance(name, str) or not name:
        raise ApiError(400, "filename is required: the slot file's name in the server's slot directory",
                       param="filename", code="invalid_value")  # fmt: skip
    bad = (len(name.encode()) > 255 or name in (".", "..") or ".." in name or any(c in name for c in "/\\:")
           or not name.isprintable() or name != name.strip())  # fmt: skip
    if bad:
        raise ApiError(400, f"invalid filename {name[:40]!r}: a plain file name (no directories, '..' or "
                       "control characters, at most 255 bytes)", param="filename", code="invalid_value")  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    return folder.resolve() / name
