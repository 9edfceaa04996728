"""HTTPS ([server] ssl_certfile and ssl_keyfile): uvicorn's own TLS, the pair checked at
start so a wrong file is a clear message, not a traceback from the first handshake."""

from __future__ import annotations

import ssl
from typing import Any

from strata_core.ops.config import ConfigError, ServerConfig


def tls_options(server: ServerConfig) -> dict[str, Any]:
    """uvicorn's keyword arguments for the server's certificate and key ({}: plain HTTP)."""
    if not server.ssl_certfile or not server.ssl_keyfile:
        return {}
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(server.ssl_certfile, server.ssl_keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"[server] ssl_certfile = {server.ssl_certfile!r}, ssl_keyfile = {server.ssl_keyfile!r}: "
                          f"cannot load them as a PEM certificate chain and its private key ({exc})") from None  # fmt: skip
    return {"ssl_certfile": server.ssl_certfile, "ssl_keyfile": server.ssl_keyfile}


def scheme(server: ServerConfig) -> str:
    return "https" if server.ssl_certfile else "http"
