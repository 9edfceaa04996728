"""The Ray Serve request router of Strata's replicas: ``prefix.rank`` over the replicas
Ray Serve reports, with the queue lengths it caches. The front passes each request as one
dict whose ``key`` is its routing key and ``avoid`` the replicas that already failed it."""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from strata_core.scale.prefix import rank


class StrataRouter(RequestRouter):  # type: ignore[misc]
    def initialize_state(self, policy: str = "prefix", busy: int = 4, **kwargs: Any) -> None:
        """``policy``: ``prefix`` or ``random``; ``busy``: a replica's requests in flight at
        which its prefixes go to a less loaded replica (its engine's slots)."""
        self.policy, self.busy = policy, busy

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        req = pending_request.args[0] if pending_request is not None and pending_request.args else {}
        req = req if isinstance(req, dict) else {}
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        cache = self.replica_queue_len_cache
        loads = {i: cache.get(r.replica_id) or 0 for i, r in by_id.items()}
        key = req.get("key") if self.policy == "prefix" else None
        ranks = rank(key, list(by_id), loads, self.busy, frozenset(req.get("avoid", ())))
        return [[by_id[i] for i in group] for group in ranks]
