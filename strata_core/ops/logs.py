"""Console logging shared by the ``strata`` command and the replicas of a cluster."""

from __future__ import annotations

import logging


def console_logging(level: str) -> None:
    """Strata's own records (the engine's errors and warnings, its exits) on the console,
    shaped like uvicorn's."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:  %(message)s"))
    logger = logging.getLogger("strata")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if level == "trace" else level.upper())
    logger.propagate = False
