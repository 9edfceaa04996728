"""A loopback server speaking the parts of the Hugging Face hub's HTTP API that
``huggingface_hub`` uses to fetch a file (point ``HF_ENDPOINT`` at ``FakeHub.url``):

- ``GET /api/models/OWNER/NAME[/revision/REV]``: the repository's files with their LFS
  size and sha256 (``?blobs=true``), and its commit;
- ``HEAD``/``GET /OWNER/NAME/resolve/REV/PATH``: the file, with ``X-Repo-Commit``,
  ``X-Linked-Etag`` (the sha256), ``X-Linked-Size``, and ``Range`` for resuming.

Faults for tests: ``cut`` (file names whose first download stops half way, the
connection closed), ``stall`` (file names whose first download waits half way until the
name's event is set), ``corrupt`` (served with a byte changed, the listed sha256 kept).
Every request is recorded in ``requests`` (method, path, headers).
"""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, dict[str, bytes]] = {}
        self.cut: set[str] = set()
        self.stall: dict[str, threading.Event] = {}
        self.corrupt: set[str] = set()
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def add(self, repo: str, files: dict[str, bytes]) -> None:
        self.repos[repo] = dict(files)

    def commit(self, repo: str) -> str:
        h = hashlib.sha1(repo.encode())
        for name, data in sorted(self.repos[repo].items()):
            h.update(name.encode() + hashlib.sha256(data).digest())
        return h.hexdigest()

    def downloads(self, name: str) -> list[dict[str, str]]:
        """The headers of each GET of a file named ``name``."""
        return [h for m, p, h in self.requests if m == "GET" and "/resolve/" in p and p.endswith("/" + name)]

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                self._serve(head=True)

            def do_GET(self) -> None:
                self._serve(head=False)

            def _serve(self, head: bool) -> None:
                path = unquote(urlsplit(self.path).path)
                hub.requests.append((self.command, path, {k.lower(): v for k, v in self.headers.items()}))
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"] and len(parts) >= 4:
                    return self._info(f"{parts[2]}/{parts[3]}", parts[5] if len(parts) > 5 else "main")
                if len(parts) >= 5 and parts[2] == "resolve":
                    return self._file(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), head)
                self._error(404, "EntryNotFound", "not found")

            def _error(self, status: int, code: str, message: str) -> None:
                body = json.dumps({"error": message}).encode()
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _repo(self, repo: str, rev: str) -> dict[str, bytes] | None:
                if repo not in hub.repos:
                    self._error(401, "RepoNotFound", "Repository not found")
                    return None
                if rev not in ("main", hub.commit(repo)):
                    self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
                    return None
                return hub.repos[repo]

            def _info(self, repo: str, rev: str) -> None:
                files = self._repo(repo, rev)
                if files is None:
                    return
                siblings = [{"rfilename": n, "size": len(d), "blobId": hashlib.sha1(d).hexdigest(),
                             "lfs": {"size": len(d), "sha256": hashlib.sha256(d).hexdigest(), "pointerSize": 134}}
                            for n, d in files.items()]  # fmt: skip
                body = json.dumps({"id": repo, "sha": hub.commit(repo), "siblings": siblings}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _file(self, repo: str, rev: str, name: str, head: bool) -> None:
                files = self._repo(repo, rev)
                if files is None:
                    return
                if name not in files:
                    return self._error(404, "EntryNotFound", f"{name} does not exist")
                data = files[name]
                sha = hashlib.sha256(data).hexdigest()
                if name in hub.corrupt:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                start = 0
                rng = self.headers.get("Range", "")
                if rng.startswith("bytes="):
                    start = int(rng[6:].split("-")[0] or 0)
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", hub.commit(repo))
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(len(data)))
                self.send_header("ETag", f'"{sha}"')
                self.send_header("Accept-Ranges", "bytes")
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                if head:
                    return
                body = data[start:]
                if name in hub.cut:
                    hub.cut.discard(name)
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if name in hub.stall:
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    hub.stall.pop(name).wait(60)
                    body = body[len(body) // 2 :]
                self.wfile.write(body)

        return Handler
