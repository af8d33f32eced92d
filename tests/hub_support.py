"""A stand-in for the Hugging Face Hub: a local HTTP server (127.0.0.1, a free port, one thread per
request) that answers huggingface_hub's file requests as the Hub does, and counts them.

It speaks ``HEAD`` and ``GET /{repo}/resolve/{revision}/{filename}`` with the headers
``hf_hub_download`` and ``get_hf_file_metadata`` read: ``X-Repo-Commit`` (the commit), ``ETag``,
``Content-Length``, and for large (LFS) files ``X-Linked-Size`` and ``X-Linked-Etag`` (the sha256);
a missing repository, revision or file is a 404 with the Hub's ``X-Error-Code``. A file may be given
a *declared* size other than its bytes (a repository whose files the Hub says are huge).

``serve(monkeypatch, tmp_path)`` starts one and points huggingface_hub at it (``HF_ENDPOINT``, and the
constants huggingface_hub reads once at import) with its cache (``HF_HOME``) in ``tmp_path``.
"""
from __future__ import annotations

import dataclasses
import hashlib
import socket
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LFS_FROM = 1024          # files this large are answered as LFS files (the Hub's rule is "large or binary")


@dataclasses.dataclass
class Repo:
    commit: str
    files: dict[str, bytes]
    declared: dict[str, int]


class StandInHub:
    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []        # (method, path) of every request, in order
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.connections = set()
        self._server.hub = self
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, repo: str, files: dict[str, bytes], *, declared: dict[str, int] | None = None,
            commit: str | None = None) -> str:
        """Serve ``files`` as ``repo`` at its ``main`` and at ``commit`` (made from the files when not
        given); ``declared`` gives some files another size. Returns the commit."""
        commit = commit or hashlib.sha1(repr(sorted(files.items())).encode()).hexdigest()
        self.repos[repo] = Repo(commit, dict(files), dict(declared or {}))
        return commit

    def gets(self, filename: str = "") -> int:
        """How many GET requests (downloads) asked for the file ``filename`` (for any file when empty)."""
        return sum(1 for method, path in self.requests
                   if method == "GET" and "/resolve/" in path and path.endswith("/" + filename if filename else ""))

    def close(self) -> None:
        """Stop answering, and drop the connections huggingface_hub keeps open: the network is gone."""
        if self._thread.is_alive():
            self._server.shutdown()
            self._server.server_close()
        for connection in list(self._server.connections):
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(monkeypatch, tmp_path) -> StandInHub:
    """A running stand-in Hub that huggingface_hub talks to, with its cache in ``tmp_path / "hf"``;
    close it when done (or to take the network away)."""
    from huggingface_hub import constants

    hub = StandInHub()
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    # huggingface_hub reads these once, when it is imported
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "DOWNLOAD_CHUNK_SIZE", 256)     # several chunks per small file: progress moves
    return hub


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        super().setup()
        self.server.connections.add(self.connection)

    def finish(self):
        super().finish()
        self.server.connections.discard(self.connection)

    def do_HEAD(self):
        self._answer(send_body=False)

    def do_GET(self):
        self._answer(send_body=True)

    def log_message(self, *args):              # quiet
        pass

    def _answer(self, send_body: bool) -> None:
        hub: StandInHub = self.server.hub
        hub.requests.append((self.command, self.path))
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
        repo_id, found, rest = path.partition("/resolve/")
        revision, _, filename = rest.partition("/")
        repo = hub.repos.get(repo_id) if found else None
        if repo is None:
            return self._not_found("RepoNotFound", None)
        if revision not in ("main", repo.commit):
            return self._not_found("RevisionNotFound", None)
        if filename not in repo.files:
            return self._not_found("EntryNotFound", repo.commit)
        data = repo.files[filename]
        size = repo.declared.get(filename, len(data))
        etag = hashlib.sha256(data).hexdigest()
        self.send_response(200)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{etag}"')
        if size >= LFS_FROM:
            self.send_header("X-Linked-Size", str(size))
            self.send_header("X-Linked-Etag", f'"{etag}"')
        self.send_header("Content-Length", str(len(data) if send_body else size))
        self.end_headers()
        if send_body:
            self.wfile.write(data)

    def _not_found(self, code: str, commit: str | None) -> None:
        body = f'{{"error": "{code}"}}'.encode()
        self.send_response(404)
        self.send_header("X-Error-Code", code)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
