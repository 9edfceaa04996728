"""Fetching a media part's http(s) URL without letting a request reach what only the
server can reach (server-side request forgery, the class of vLLM's CVE-2025-6242).

Every hop, the first request and each redirect, is checked before it is made: its
host must be in ``[server] media_domains`` when that list is set, and every address
the host resolves to must be public (not loopback, link-local, private, multicast,
reserved or unspecified) unless it lies in ``[server] media_networks``. The request
then connects to the address that was checked, with the URL's host in ``Host`` and in
TLS's SNI and certificate check, so a second DNS answer cannot swap it. Redirects are
followed here, one hop at a time, never by the HTTP client."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from urllib.parse import urljoin, urlsplit

import httpx

from strata_core.ops.config import ServerConfig
from strata_core.schema.errors import ApiError

MAX_REDIRECTS = 3

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
#: host, port -> the addresses it resolves to (a test passes its own)
Resolver = Callable[[str, int], Awaitable[Sequence[str]]]

#: the address classes a fetch refuses, each with the name the refusal gives it
_CLASSES = (("loopback", "is_loopback"), ("link-local", "is_link_local"), ("multicast", "is_multicast"),
            ("unspecified", "is_unspecified"), ("reserved", "is_reserved"), ("private", "is_private"))  # fmt: skip


def bad_part(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, f"{param}: {message}", param=param, code=code)


async def system_resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]


def address_class(ip: Address) -> str | None:
    """Why ``ip`` is not a public address (its class), or None when it is."""
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    ip = mapped or ip  # ::ffff:127.0.0.1 is loopback
    for name, test in _CLASSES:
        if getattr(ip, test):
            return name
    return None if ip.is_global else "non-public"


def domain_allowed(host: str, domains: Sequence[str]) -> bool:
    """``host`` is one of ``domains``, or under a ``*.example.com`` entry; no list: any."""
    host = host.lower().rstrip(".")
    for d in (d.lower().rstrip(".") for d in domains):
        if host == d or (d.startswith("*.") and host.endswith(d[1:])):
            return True
    return not domains


async def checked_address(
    url: str, param: str, server: ServerConfig, resolve: Resolver, hop: int = 0
) -> tuple[str, Address]:
    """The host of ``url`` (the first URL, or the ``hop``-th redirect's) and the address a
    fetch of it may connect to, or a 400 naming ``param`` and the rule that refuses it."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        port = parts.port or 0
    except ValueError:
        host = ""
    if parts.scheme not in ("http", "https") or not host:
        raise bad_part(param, f"expected an http(s) URL with a host (and a port in 1..65535), not {url[:80]!r}")
    via = f" (redirect {hop})" if hop else ""
    if not domain_allowed(host, server.media_domains):
        raise bad_part(param, f"the host {host!r}{via} is not in [server] media_domains", "fetch_refused")
    try:
        found = [ipaddress.ip_address(a.split("%")[0]) for a in await resolve(host, port)]
    except (OSError, UnicodeError):
        raise bad_part(param, f"the host {host!r} does not resolve", "fetch_failed") from None
    networks = [ipaddress.ip_network(n) for n in server.media_networks]
    for ip in found:  # one refused address refuses the host: a later lookup could pick it
        kind = address_class(ip)
        if kind is not None and not any(ip in n for n in networks if n.version == ip.version):
            raise bad_part(param, f"the host {host!r}{via} resolves to {ip}, a {kind} address, which this server does "
                           "not fetch from (an operator allows a network with [server] media_networks)",
                           "fetch_refused")  # fmt: skip
    if not found:
        raise bad_part(param, f"the host {host!r} does not resolve", "fetch_failed")
    return host, found[0]


def pinned_request(client: httpx.AsyncClient, url: str, host: str, ip: Address) -> httpx.Request:
    """A GET of ``url`` sent to ``ip``, the host kept in Host and in TLS's server name."""
    parts = urlsplit(url)
    target = httpx.URL(url).copy_with(host=str(ip))
    name = f"[{host}]" if ":" in host else host  # an IPv6 literal keeps its brackets
    host_header = name if parts.port is None else f"{name}:{parts.port}"
    return client.build_request("GET", target, headers={"Host": host_header}, extensions={"sni_hostname": host})


async def fetch(url: str, param: str, server: ServerConfig, resolve: Resolver = system_resolve) -> bytes:
    """An http(s) URL's body, within [server]'s byte limit and timeout, each hop checked
    (the module's rules); at most MAX_REDIRECTS redirects, to http(s) URLs only."""
    if not server.fetch_media:
        raise bad_part(param, "this server does not fetch media from URLs ([server] fetch_media = false); "
                       "send the bytes as a base64 data URL", "fetch_refused")  # fmt: skip
    try:
        # trust_env off: a proxy from the environment would resolve the host itself
        async with httpx.AsyncClient(timeout=server.fetch_media_timeout, follow_redirects=False,
                                     trust_env=False) as client:  # fmt: skip
            return await asyncio.wait_for(_follow(client, url, param, server, resolve), server.fetch_media_timeout)
    except (httpx.TimeoutException, TimeoutError):
        raise bad_part(param, f"fetching the URL took over {server.fetch_media_timeout} s", "fetch_failed") from None
    except httpx.InvalidURL:
        raise bad_part(param, f"expected an http(s) URL, not {url[:80]!r}") from None
    except httpx.HTTPError as exc:
        raise bad_part(param, f"fetching the URL failed: {type(exc).__name__}", "fetch_failed") from None


async def _follow(client: httpx.AsyncClient, url: str, param: str, server: ServerConfig, resolve: Resolver) -> bytes:
    for hop in range(MAX_REDIRECTS + 1):
        host, ip = await checked_address(url, param, server, resolve, hop)
        response = await client.send(pinned_request(client, url, host, ip), stream=True)
        try:
            if not response.is_redirect:
                return await _body(response, param, server.fetch_media_max_bytes)
            url = urljoin(url, response.headers.get("location", ""))
            if not url.startswith(("http://", "https://")):
                raise bad_part(param, "the URL redirects to a non-http(s) URL, which is not followed")
        finally:
            await response.aclose()
    raise bad_part(param, f"the URL redirects more than {MAX_REDIRECTS} times", "fetch_failed")


async def _body(response: httpx.Response, param: str, limit: int) -> bytes:
    if response.status_code != 200:
        raise bad_part(param, f"fetching the URL answered HTTP {response.status_code}", "fetch_failed")
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > limit:
            raise bad_part(param, f"the fetched media is over {limit} bytes ([server] fetch_media_max_bytes)",
                           "media_too_large")  # fmt: skip
    return bytes(body)
