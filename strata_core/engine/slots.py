"""The server's slot actions (``SLOT``): every slot's state, and an idle slot's cache
written to a file, read back from one or dropped. A restored cache is a slot's cache like
any other: the next request whose prompt starts with its tokens reuses them."""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

from strata_core.contract import protocol as proto
from strata_core.engine.llama import Llama
from strata_core.engine.request import Request, Slot


def slot_action(cmd: proto.SlotCommand, slots: list[Slot], llama: Llama, speculative: bool) -> proto.Event:
    """The answer to one ``SLOT`` command (run between steps: it reads and writes the KV)."""
    if cmd.action == "list":
        return proto.SlotInfo(cmd.rid, [describe(s, llama.n_ctx, speculative) for s in slots])
    if not 0 <= cmd.slot < len(slots):
        return proto.Error(cmd.rid, f"slot {cmd.slot} does not exist (this engine has slots 0..{len(slots) - 1})")
    slot = slots[cmd.slot]
    if slot.req is not None:
        return proto.Error(cmd.rid, f"{proto.SLOT_BUSY} slot {cmd.slot} is processing a request")
    t0 = time.perf_counter()
    if cmd.action == "save":
        written = llama.seq_save_file(slot.seq, cmd.path, slot.cached)
        if not written:
            return proto.Error(cmd.rid, f"slot {cmd.slot} could not be saved to {os.path.basename(cmd.path)}")
        return proto.SlotInfo(cmd.rid, {"id_slot": slot.seq, "n_saved": len(slot.cached), "n_written": written,
                                        "timings": {"save_ms": _ms(t0)}})  # fmt: skip
    if cmd.action == "restore":
        return _restore(cmd, slot, llama, t0)
    erased = len(slot.cached)
    _forget(slot, llama)
    return proto.SlotInfo(cmd.rid, {"id_slot": slot.seq, "n_erased": erased})


def _restore(cmd: proto.SlotCommand, slot: Slot, llama: Llama, t0: float) -> proto.Event:
    name = os.path.basename(cmd.path)
    if not os.path.isfile(cmd.path):
        return proto.Error(cmd.rid, f"no saved slot named {name}")
    _forget(slot, llama)
    tokens, read = llama.seq_load_file(slot.seq, cmd.path, llama.n_ctx)
    if not read or any(t >= llama.n_vocab for t in tokens):
        _forget(slot, llama)
        return proto.Error(cmd.rid, f"{name} does not hold a slot of this model and context "
                           f"(at most {llama.n_ctx} tokens)")  # fmt: skip
    # a cache asked for by name: worth keeping in host memory when its slot moves on
    slot.cached, slot.reused = tokens, True
    return proto.SlotInfo(cmd.rid, {"id_slot": slot.seq, "n_restored": len(tokens), "n_read": read,
                                    "timings": {"restore_ms": _ms(t0)}})  # fmt: skip


def _forget(slot: Slot, llama: Llama) -> None:
    llama.seq_trim(slot.seq, 0)
    slot.forget()


def _ms(t0: float) -> float:
    return round((time.perf_counter() - t0) * 1e3, 3)


def describe(slot: Slot, n_ctx: int, speculative: bool) -> dict[str, Any]:
    """One slot as llama-server's ``GET /slots`` shows it (its request's part while it has one)."""
    req = slot.req
    out: dict[str, Any] = {"id": slot.seq, "n_ctx": n_ctx, "speculative": speculative,
                           "is_processing": req is not None, "n_prompt_tokens": len(slot.cached)}  # fmt: skip
    if req is not None:
        out.update(id_task=req.rid, n_prompt_tokens_processed=len(req.prompt) - req.cached, n_prompt_tokens_cache=req.cached,
                   params=_params(req), next_token=[{"has_next_token": True, "n_remain": req.max_tokens - req.generated,
                                                     "n_decoded": req.generated}])  # fmt: skip
    return out


def _params(req: Request) -> dict[str, Any]:
    """The request's scalar sampling settings, and its token limit, by their engine names."""
    p = req.params
    out = {f.name: getattr(p, f.name) for f in dataclasses.fields(p) if isinstance(getattr(p, f.name), (int, float))}
    out.update(max_tokens=req.max_tokens, n_probs=req.logprobs or 0, speculative=req.spec_k > 0)
    return out
