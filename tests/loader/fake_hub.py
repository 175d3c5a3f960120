"""A local HTTP server that serves folders the way the Hugging Face hub's file API does.

No hub is reachable where these tests run, so this stands in for it (``HF_ENDPOINT``): the same three routes
``huggingface_hub.snapshot_download`` uses (repo info at a revision, the file tree at a commit, and file
``resolve`` with the commit and ETag headers), the hub's error codes, and an optional bearer token.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class FakeRepo:
    """One model repository: each revision name (branch or tag) maps to a commit, each commit to a folder."""

    revisions: dict[str, str]  # revision name -> commit hash (40 hex digits)
    commits: dict[str, Path]  # commit hash -> folder of that commit's files
    token: str | None = None  # a private repository: requests need ``Authorization: Bearer <token>``

    def commit_of(self, revision: str) -> str | None:
        return revision if revision in self.commits else self.revisions.get(revision)


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo]
    downloaded: list[str] = field(default_factory=list)  # "repo_id/path" of each file body served

    def serve(self) -> tuple[ThreadingHTTPServer, str]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output quiet
                pass

            def do_HEAD(self) -> None:
                self._answer(head=True)

            def do_GET(self) -> None:
                self._answer(head=False)

            def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _error(self, status: int, code: str, head: bool) -> None:
                body = json.dumps({"error": code}).encode()
                self._send(status, body, {"X-Error-Code": code, "Content-Type": "application/json"}, head)

            def _answer(self, head: bool) -> None:
                parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
                if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
                    repo_id, kind, revision, rest = "/".join(parts[2:4]), parts[4], parts[5], parts[6:]
                elif len(parts) >= 5 and parts[2] == "resolve":
                    repo_id, kind, revision, rest = "/".join(parts[:2]), "resolve", parts[3], parts[4:]
                else:
                    return self._error(404, "EntryNotFound", head)
                repo = hub.repos.get(repo_id)
                if repo is None or (repo.token and self.headers.get("Authorization") != f"Bearer {repo.token}"):
                    return self._error(401 if repo else 404, "RepoNotFound", head)
                commit = repo.commit_of(revision)
                if commit is None:
                    return self._error(404, "RevisionNotFound", head)
                root = repo.commits[commit]
                files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
                if kind == "revision":
                    info = {"id": repo_id, "sha": commit, "siblings": [{"rfilename": f} for f in files]}
                    return self._send(200, json.dumps(info).encode(), {"Content-Type": "application/json"}, head)
                if kind == "tree":
                    tree = [
                        {"type": "file", "path": f, "size": (root / f).stat().st_size, "oid": _sha1(root / f)}
                        for f in files
                    ]
                    return self._send(200, json.dumps(tree).encode(), {"Content-Type": "application/json"}, head)
                path = "/".join(rest)
                if path not in files:
                    return self._error(404, "EntryNotFound", head)
                body = (root / path).read_bytes()
                if not head:
                    hub.downloaded.append(f"{repo_id}/{path}")
                headers = {"X-Repo-Commit": commit, "ETag": f'"{_sha1(root / path)}"'}
                self._send(200, body, headers, head)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server, f"http://127.0.0.1:{server.server_address[1]}"


def _sha1(path: Path) -> str:
    return hashlib.sha1(path.read_bytes()).hexdigest()
