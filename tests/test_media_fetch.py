"""Fetching media from URLs (api/media_fetch.py) against real HTTP servers on loopback:
the limits, and every refusal of an address only the server can reach, at the first URL
and at each redirect; with [server] media_networks the same fetch goes through."""

from __future__ import annotations

import asyncio
import http.server
import ipaddress
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import pytest

from strata_core.api.media_fetch import address_class, domain_allowed, fetch
from strata_core.ops.config import ConfigError, ServerConfig, load_config
from strata_core.schema.errors import ApiError

PART = "messages.0.content.1"


@dataclass
class Site:
    base: str
    port: int
    #: the Host header of each request it answered
    hosts: list[str] = field(default_factory=list)


def handler(site: Site, routes: dict[str, tuple[int, dict[str, str], bytes]]) -> type:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
            site.hosts.append(self.headers.get("Host", ""))
            status, headers, body = routes.get(self.path, (404, {}, b"no"))
            if self.path == "/slow":
                time.sleep(2)
            try:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (/slow)
                pass

        def log_message(self, *args: object) -> None:
            pass

    return Handler


def serve(address: str, routes: dict[str, tuple[int, dict[str, str], bytes]]) -> Iterator[Site]:
    site = Site("", 0)
    httpd = http.server.ThreadingHTTPServer((address, 0), handler(site, routes))
    site.port = httpd.server_address[1]
    site.base = f"http://{address}:{site.port}"
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield site
    httpd.shutdown()


@pytest.fixture(scope="module")
def other() -> Iterator[Site]:
    """A second loopback address's server (Linux routes all of 127.0.0.0/8 to lo)."""
    yield from serve("127.0.0.2", {"/img": (200, {}, b"OTHER")})


@pytest.fixture(scope="module")
def site(other: Site) -> Iterator[Site]:
    routes = {"/img": (200, {}, b"PIXELS" * 10), "/big": (200, {}, b"x" * 5000),
              "/to-img": (302, {"Location": "/img"}, b""), "/to-file": (302, {"Location": "file:///etc/passwd"}, b""),
              "/loop": (302, {"Location": "/loop"}, b""), "/slow": (200, {}, b""),
              "/to-other": (302, {"Location": f"{other.base}/img"}, b""),
              "/to-metadata": (302, {"Location": "http://169.254.169.254/latest/meta-data/"}, b""),
              "/to-named": (302, {"Location": f"http://elsewhere.test:{other.port}/img"}, b"")}  # fmt: skip
    yield from serve("127.0.0.1", routes)


#: the tests' sites are all on loopback, which only this setting lets a fetch reach
LOOPBACK = ServerConfig(fetch_media=True, fetch_media_max_bytes=1024, fetch_media_timeout=10,
                        media_networks=["127.0.0.0/8"])  # fmt: skip
PUBLIC_ONLY = ServerConfig(fetch_media=True, fetch_media_timeout=5)


def refused(url: str, server: ServerConfig, resolve: object = None) -> ApiError:
    kwargs = {"resolve": resolve} if resolve else {}
    with pytest.raises(ApiError) as err:
        asyncio.run(fetch(url, PART, server, **kwargs))  # type: ignore[arg-type]
    assert (err.value.status, err.value.param) == (400, PART)
    assert err.value.message.startswith(f"{PART}: ")
    return err.value


def names(table: dict[str, str]):  # type: ignore[no-untyped-def]
    """A resolver that knows these hosts (and nothing else)."""

    async def resolve(host: str, port: int) -> Sequence[str]:
        if host not in table:
            raise OSError("unknown host")
        return table[host].split(",")

    return resolve


@pytest.mark.parametrize(
    "path,code",
    [("/big", "media_too_large"), ("/to-file", "invalid_value"), ("/loop", "fetch_failed"),
     ("/slow", "fetch_failed"), ("/missing", "fetch_failed")],
)  # fmt: skip
def test_fetches_that_are_refused(site: Site, path: str, code: str) -> None:
    server = LOOPBACK.model_copy(update={"fetch_media_timeout": 0.5}) if path == "/slow" else LOOPBACK
    assert refused(site.base + path, server).code == code


def test_a_fetch_follows_http_redirects_within_the_limits(site: Site) -> None:
    assert asyncio.run(fetch(site.base + "/to-img", "p", LOOPBACK)) == b"PIXELS" * 10
    assert refused(site.base + "/img", ServerConfig()).code == "fetch_refused"  # fetch_media off


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999/a.png", "http:///a.png", "ftp://example.com/a.png"])
def test_urls_that_are_not_fetchable_are_400s(url: str) -> None:
    err = refused(url, LOOPBACK)
    assert err.code == "invalid_value" and "expected an http(s) URL with a host" in err.message


def test_each_address_class_is_named() -> None:
    cases = {"127.0.0.1": "loopback", "::1": "loopback", "169.254.169.254": "link-local", "fe80::1": "link-local",
             "10.1.2.3": "private", "172.16.0.1": "private", "192.168.1.1": "private", "fd00::1": "private",
             "224.0.0.1": "multicast", "ff02::1": "multicast", "240.0.0.1": "reserved", "0.0.0.0": "unspecified",
             "::ffff:127.0.0.1": "loopback", "100.64.0.1": "non-public", "8.8.8.8": None, "2001:4860::8888": None}  # fmt: skip
    assert {a: address_class(ipaddress.ip_address(a)) for a in cases} == cases


@pytest.mark.parametrize(
    "url,kind",
    [("http://169.254.169.254/latest/meta-data/", "link-local"), ("http://10.0.0.1/a.png", "private"),
     ("http://192.168.0.1/a.png", "private"), ("http://224.0.0.1/a.png", "multicast"),
     ("http://240.0.0.1/a.png", "reserved"), ("http://0.0.0.0/a.png", "unspecified"),
     ("http://[::1]/a.png", "loopback"), ("http://[fe80::1]/a.png", "link-local"),
     ("http://[::ffff:127.0.0.1]/a.png", "loopback")],
)  # fmt: skip
def test_addresses_only_the_server_reaches_are_refused(url: str, kind: str) -> None:
    err = refused(url, PUBLIC_ONLY)
    assert err.code == "fetch_refused" and f"a {kind} address" in err.message, err.message


def test_a_loopback_server_is_refused_and_never_asked(site: Site) -> None:
    asked = len(site.hosts)
    for url in (f"{site.base}/img", f"http://localhost:{site.port}/img"):  # by address, and by name
        err = refused(url, PUBLIC_ONLY)
        assert err.code == "fetch_refused" and "loopback" in err.message, err.message
    assert len(site.hosts) == asked
    # the same fetch where the operator allows loopback
    assert asyncio.run(fetch(f"http://localhost:{site.port}/img", PART, LOOPBACK)) == b"PIXELS" * 10


def test_every_redirect_is_checked(site: Site, other: Site) -> None:
    only_first = LOOPBACK.model_copy(update={"media_networks": ["127.0.0.1/32"]})
    # the fixture: the redirect's target answers when its network is allowed
    assert asyncio.run(fetch(site.base + "/to-other", PART, LOOPBACK)) == b"OTHER"
    asked = len(other.hosts)
    err = refused(site.base + "/to-other", only_first)
    assert "(redirect 1) resolves to 127.0.0.2, a loopback address" in err.message, err.message
    assert len(other.hosts) == asked
    err = refused(site.base + "/to-metadata", LOOPBACK)
    assert "'169.254.169.254' (redirect 1) resolves to 169.254.169.254, a link-local address" in err.message


def test_a_host_resolving_to_any_refused_address_is_refused() -> None:
    resolve = names({"mixed.test": "93.184.216.34,10.0.0.7"})
    err = refused("http://mixed.test/a.png", PUBLIC_ONLY, resolve)
    assert "resolves to 10.0.0.7, a private address" in err.message


def test_the_connection_goes_to_the_address_that_was_checked(site: Site) -> None:
    """A name the system cannot resolve, answered once by the checking resolver: the fetch
    reaches the site only if it connects to that checked address (a second lookup, a
    rebinding attacker's chance, would fail), and the site sees the name as Host."""
    answers = iter(["127.0.0.1"])

    async def once(host: str, port: int) -> Sequence[str]:
        return [next(answers, "169.254.169.254")]

    assert asyncio.run(fetch(f"http://media.test:{site.port}/img", PART, LOOPBACK, resolve=once)) == b"PIXELS" * 10
    assert site.hosts[-1] == f"media.test:{site.port}"


def test_media_domains_allow_listed_hosts_only(site: Site, other: Site) -> None:
    listed = LOOPBACK.model_copy(update={"media_domains": ["media.test", "*.cdn.test"]})
    resolve = names({"media.test": "127.0.0.1", "a.cdn.test": "127.0.0.1", "elsewhere.test": "127.0.0.2"})
    assert asyncio.run(fetch(f"http://a.cdn.test:{site.port}/img", PART, listed, resolve)) == b"PIXELS" * 10
    err = refused(f"http://127.0.0.1:{site.port}/img", listed, resolve)
    assert err.code == "fetch_refused" and "'127.0.0.1' is not in [server] media_domains" in err.message
    err = refused(f"http://media.test:{site.port}/to-named", listed, resolve)
    assert "'elsewhere.test' (redirect 1) is not in [server] media_domains" in err.message
    # the fixture: with no list, the same redirect is followed
    assert asyncio.run(fetch(f"http://media.test:{site.port}/to-named", PART, LOOPBACK, resolve)) == b"OTHER"
    assert domain_allowed("x.test", []) and not domain_allowed("cdn.test", ["*.cdn.test"])


def test_the_settings_are_checked_and_read_from_the_environment() -> None:
    env = {"STRATA_SERVER_MEDIA_NETWORKS": "10.0.0.0/8, fd00::/8", "STRATA_SERVER_MEDIA_DOMAINS": "a.test"}
    server = load_config(env=env).server
    assert (server.media_networks, server.media_domains) == (["10.0.0.0/8", "fd00::/8"], ["a.test"])
    with pytest.raises(ConfigError, match="media_networks.*'10.0.0.300/8' is not a network in CIDR form"):
        load_config(env={"STRATA_SERVER_MEDIA_NETWORKS": "10.0.0.300/8"})
