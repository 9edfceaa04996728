"""LoRA adapters changed while the engine runs (the LORA commands): loaded, unloaded, and
their default scales set, the scales a request without its own gets.

New default scales wait for the requests already running under the old ones: until
those finish, a new request without scales of its own is given the new ones as its own
(and decodes apart, as any request with its own scales does); then the new scales become
the defaults and every slot's cached prefix, computed under the old ones, is dropped."""

from __future__ import annotations

from strata_core.contract import protocol as proto
from strata_core.engine.llama import Llama, LlamaError
from strata_core.engine.loop import Engine
from strata_core.engine.request import Request


class Adapters:
    def __init__(self, llama: Llama, engine: Engine) -> None:
        self.llama, self.engine = llama, engine
        #: default scales set but not yet in force (requests under the old ones still run)
        self.pending: tuple[float, ...] | None = None

    def listing(self, rid: str) -> proto.Adapters:
        """The adapters loaded now, with the default scales requests will get."""
        scales = self.defaults()
        return proto.Adapters(rid, tuple(proto.LoraAdapter(i, scales[i], self.llama.lora_paths[i])
                                          for i in self.llama.lora_loaded()))  # fmt: skip

    def defaults(self) -> tuple[float, ...]:
        return self.pending if self.pending is not None else self.llama.lora_scales

    def handle(self, cmd: proto.LoraCommand) -> proto.Event:
        """Apply one LORA command; the adapters after it, or why not."""
        llama = self.llama
        if isinstance(cmd, proto.LoraLoad):
            try:
                llama.load_lora(cmd.path)
            except LlamaError as exc:
                return proto.Error(cmd.rid, str(exc))
            if self.pending is not None:
                self.pending = (*self.pending, 0.0)
        elif isinstance(cmd, proto.LoraUnload):
            if cmd.id not in llama.lora_loaded():
                return proto.Error(cmd.rid, f"no LoRA adapter {cmd.id} is loaded")
            if any(self._uses(req, cmd.id) for req in self._requests()):
                return proto.Error(cmd.rid, f"LoRA adapter {cmd.id} is in use by a request in flight")
            changes_defaults = self.defaults()[cmd.id] != 0.0
            llama.free_lora(cmd.id)
            if self.pending is not None:
                self.pending = tuple(0.0 if i == cmd.id else v for i, v in enumerate(self.pending))
            if changes_defaults:
                self._forget_caches()
        else:
            scales = dict(cmd.scales)
            if any(i not in llama.lora_loaded() for i in scales):
                missing = min(i for i in scales if i not in llama.lora_loaded())
                return proto.Error(cmd.rid, f"no LoRA adapter {missing} is loaded")
            new = tuple(scales.get(i, 0.0) for i in range(len(llama.lora_scales)))
            self.pending = None if new == llama.lora_scales else new
            self.settle()
        return self.listing(cmd.rid)

    def own_scales(self, asked: dict[int, float]) -> tuple[float, ...] | None:
        """The scales a new request runs under when they are not the defaults in force
        (None: those); ``asked``: its own, empty for the default ones."""
        n = len(self.llama.lora_scales)
        scales = tuple(asked.get(i, 0.0) for i in range(n)) if asked else self.defaults()
        return None if scales == self.llama.lora_scales else scales

    def settle(self) -> None:
        """Put pending default scales in force once no request runs under the old ones."""
        if self.pending is None or any(req.lora is None for req in self._requests()):
            return
        self.llama.lora_scales, self.pending = self.pending, None
        self._forget_caches()

    def _requests(self) -> list[Request]:
        sched = self.engine.scheduler
        return [*sched.waiting, *(s.req for s in sched.slots if s.req is not None)]

    def _uses(self, req: Request, i: int) -> bool:
        scales = self.llama.lora_scales if req.lora is None else req.lora
        return i < len(scales) and scales[i] != 0.0

    def _forget_caches(self) -> None:
        """Drop the prefixes idle slots and host memory keep: their KV is of other scales."""
        sched = self.engine.scheduler
        for slot in sched.slots:
            if slot.req is None:
                self.llama.seq_trim(slot.seq, 0)
                slot.forget()
        sched.saved.clear()
