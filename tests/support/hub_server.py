"""A local Hugging Face Hub-compatible HTTP server for the download tests (no internet
here): the API JSON huggingface_hub reads (model search, model info with LFS blobs) and
`resolve` downloads with HEAD, Range requests and the Hub's error headers. It can drop a
connection mid-file, stay broken, corrupt bytes, and counts the bytes it sent. Another
instance can stand in for the Hub's CDN (`redirect_to`): file downloads are then
redirected there, as the Hub does, and the CDN records the Authorization it was sent."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Repo:
    files: dict[str, Path]
    gated: bool = False
    downloads: int = 0
    license: str = "apache-2.0"
    card: str = "# A model\n"
    pipeline_tag: str = "text-generation"
    sha: dict[str, str] = field(default_factory=dict)
    lfs: bool = True  # False: files kept in git, their ETag the git blob id, no sha256
    tags: tuple[str, ...] = ()  # beside "gguf" and the license

    def __post_init__(self):
        for name, path in self.files.items():
            data = path.read_bytes()
            self.sha[name] = hashlib.sha256(data).hexdigest() if self.lfs else \
                hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubServer:
    def __init__(self, repos: dict[str, Repo]):
        self.repos = repos
        self.sent = 0                  # body bytes of file downloads
        self.drop_after: int | None = None  # the next download stops after this many bytes
        self.broken = False            # every download breaks at once
        self.break_after_drop = False  # and stays broken once a download was dropped
        self.corrupt = False           # flip a byte of every download
        self.chunk_delay = 0.0         # seconds per 64 KiB sent: a slow link
        self.redirect_to: str | None = None  # a CDN's URL that file downloads go to
        self.authorizations: list[str | None] = []  # per file GET, what it carried
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *_args):
                pass

            def do_GET(self):
                hub.handle(self, body=True)

            def do_HEAD(self):
                hub.handle(self, body=False)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address):
                pass  # clients that drop a kept-alive connection are expected here

        self.httpd = Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    # -- routes --------------------------------------------------------------------

    def handle(self, request: BaseHTTPRequestHandler, body: bool) -> None:
        url = urlparse(request.path)
        path = unquote(url.path)
        if path == "/api/models":
            return self.search(request, parse_qs(url.query))
        if path.startswith("/api/models/"):
            repo_id = path[len("/api/models/"):].split("/revision/")[0]
            return self.info(request, repo_id)
        if "/resolve/" in path:
            repo_id, rest = path.lstrip("/").split("/resolve/", 1)
            return self.resolve(request, repo_id, rest.split("/", 1)[1], body)
        self.error(request, 404, "EntryNotFound")

    def search(self, request, query) -> None:
        text = query.get("search", [""])[0].lower()
        found = [self.summary(name, repo) for name, repo in self.repos.items()
                 if text in name.lower()]
        found.sort(key=lambda m: -m["downloads"])
        self.json(request, found)

    def summary(self, name: str, repo: Repo) -> dict:
        return {"id": name, "modelId": name, "downloads": repo.downloads, "likes": 1,
                "lastModified": "2026-11-01T00:00:00.000Z", "gated": repo.gated,
                "private": False, "pipeline_tag": repo.pipeline_tag,
                "tags": ["gguf", f"license:{repo.license}", *repo.tags]}

    def info(self, request, repo_id: str) -> None:
        repo = self.repos.get(repo_id)
        if repo is None:
            return self.error(request, 401, "RepoNotFound")
        siblings = [{"rfilename": "README.md", "size": len(repo.card)}]
        for name, path in repo.files.items():
            size = path.stat().st_size
            lfs = {"lfs": {"sha256": repo.sha[name], "size": size, "pointerSize": 134}} \
                if repo.lfs else {}
            siblings.append({"rfilename": name, "size": size,
                             "blobId": repo.sha[name][:40], **lfs})
        self.json(request, {**self.summary(repo_id, repo), "sha": COMMIT,
                            "siblings": siblings})

    def resolve(self, request, repo_id: str, name: str, body: bool) -> None:
        repo = self.repos.get(repo_id)
        if repo is None:
            return self.error(request, 401, "RepoNotFound", body)
        if repo.gated and not request.headers.get("authorization"):
            return self.error(request, 401, "GatedRepo", body)
        if name == "README.md":
            data = repo.card.encode()
            return self.send(request, 200, data, {"ETag": '"card"'}, body)
        path = repo.files.get(name)
        if path is None:
            return self.error(request, 404, "EntryNotFound", body)
        data = path.read_bytes()
        linked = {"X-Linked-Etag": f'"{repo.sha[name]}"', "X-Linked-Size": str(len(data))}
        if self.redirect_to:
            location = f"{self.redirect_to}/{repo_id}/resolve/{COMMIT}/{name}"
            return self.send(request, 302, b"", {**linked, "Location": location}, body)
        if body:
            self.authorizations.append(request.headers.get("authorization"))
        start, status, headers = 0, 200, {"ETag": f'"{repo.sha[name]}"', **linked}
        ranged = request.headers.get("range")
        if ranged:
            first, _, last = ranged.removeprefix("bytes=").partition("-")
            start, end = int(first), int(last) if last else len(data) - 1
            end = min(end, len(data) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start:end + 1], 206
        if self.corrupt and body:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        self.send(request, status, data, headers, body, stream=True)

    # -- answers -------------------------------------------------------------------

    def json(self, request, value) -> None:
        self.send(request, 200, json.dumps(value).encode(),
                  {"Content-Type": "application/json"}, True)

    def error(self, request, status: int, code: str, body: bool = True) -> None:
        """An error answer; without a body for HEAD (one there would be read as the start
        of the next answer on the same kept-alive connection)."""
        self.send(request, status, json.dumps({"error": code}).encode(),
                  {"X-Error-Code": code, "Content-Type": "application/json"}, body)

    def send(self, request, status: int, data: bytes, headers: dict, body: bool,
             stream: bool = False) -> None:
        request.send_response(status)
        for key, value in {**headers, "X-Repo-Commit": COMMIT, "Accept-Ranges": "bytes",
                           "Content-Length": str(len(data))}.items():
            request.send_header(key, value)
        request.end_headers()
        if not body:
            return
        if not stream:
            request.wfile.write(data)
            return
        limit = 0 if self.broken else self.drop_after
        self.drop_after = None
        self.broken = self.broken or (limit is not None and self.break_after_drop)
        if limit is not None:  # send part of the body, then cut the connection
            data = data[:limit]
        for offset in range(0, len(data), 64 << 10):
            chunk = data[offset:offset + (64 << 10)]
            try:
                request.wfile.write(chunk)
            except OSError:  # the client went away (a paused or killed download)
                return
            self.sent += len(chunk)
            if self.chunk_delay:
                time.sleep(self.chunk_delay)
        if limit is not None:
            request.wfile.flush()
            request.close_connection = True
            request.connection.shutdown(2)
