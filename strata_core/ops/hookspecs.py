"""The hooks a Strata plugin may implement."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from strata_core.ops.backend_spec import Backend

hookspec = pluggy.HookspecMarker("strata")
hookimpl = pluggy.HookimplMarker("strata")


@hookspec
def strata_backends() -> list[Backend]:  # type: ignore[empty-body]
    """Return the backends this plugin provides, as instances of ``strata_core.ops.backend_spec.Backend``.

    Called once when the registry loads. Must not load native libraries or shell out:
    probing happens later, only when a backend is asked about.
    """
