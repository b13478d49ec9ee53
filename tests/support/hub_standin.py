"""A local stand-in for the Hugging Face Hub's HTTP API, because no hub is reachable from this machine or from CI.

tuneline publishes through huggingface_hub's public API (create_repo, create_branch, upload_folder) unchanged; this
server answers only the requests those calls send, as read from the installed huggingface_hub:
- POST /api/repos/create                      -> the repo's URL (409 with the URL when it exists)
- POST /api/models/{repo}/branch/{branch}     -> a branch from main (409 when it exists)
- POST /api/models/{repo}/preupload/{rev}     -> "regular" for every file, so no LFS or Xet storage is needed
- POST /api/models/{repo}/commit/{rev}        -> NDJSON: a header line, then each file base64-encoded
- POST /api/validate-yaml                     -> the README check huggingface_hub makes without hf_xet
- GET /api/{models|datasets}/{repo}[/revision/{rev}] -> the repo's id and the commit `rev` (default main) is at, as
  model_info/dataset_info read it; `set_head` moves a branch, and each commit moves its branch
A wrong token gets 401, as the hub answers it; a missing one is refused only where a write or a private repo needs
one. What it received is kept for tests to assert on.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

REPO_PATH = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/(?P<op>branch|preupload|commit)/(?P<rev>[^?]+)")
INFO_PATH = re.compile(r"^/api/(?P<kind>models|datasets)/(?P<repo>[^/?]+/[^/?]+)(?:/revision/(?P<rev>[^?]+))?(?:\?|$)")


class HubStandIn:
    """`with HubStandIn(token) as hub:` serves on 127.0.0.1 at `hub.url` until the block ends."""

    def __init__(self, token: str, user: str = "standin-user"):
        self.token, self.user = token, user
        self.repos: dict[str, dict] = {}  # repo id -> {"private": bool, "branches": {name: {path: bytes}}}
        self.commits: list[dict] = []  # {"repo", "revision", "summary", "files"} in order
        self.authorizations: list[str] = []  # every Authorization header received
        self.heads: dict[tuple[str, str], dict[str, str]] = {}  # (models|datasets, repo id) -> {branch: commit}
        self.info_requests: list[str] = []  # the path of every info request
        self._lock = threading.Lock()

    def __enter__(self) -> HubStandIn:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def files(self, repo_id: str, branch: str = "main") -> dict[str, bytes]:
        return self.repos[repo_id]["branches"][branch]

    def set_head(self, repo_id: str, commit: str, branch: str = "main", kind: str = "models") -> None:
        """Point `branch` of a repo (a public one, made here when new) at `commit`, as a push upstream would."""
        self.heads.setdefault((kind, repo_id), {})[branch] = commit

    # --- the endpoints: (status, JSON body)
    def create_repo(self, body: dict) -> tuple[int, dict]:
        repo_id = f"{body.get('organization') or self.user}/{body['name']}"
        answer = {"url": f"{self.url}/{repo_id}", "name": repo_id}
        if repo_id in self.repos:
            return 409, {**answer, "error": "You already created this model repo"}
        self.repos[repo_id] = {"private": body.get("visibility") == "private", "branches": {"main": {}}}
        self.set_head(repo_id, hashlib.sha1(repo_id.encode()).hexdigest())  # the hub's initial commit
        return 200, answer

    def repo_info(self, kind: str, repo_id: str, revision: str | None, authorized: bool) -> tuple[int, dict]:
        heads = self.heads.get((kind, repo_id))
        if heads is None or (self.repos.get(repo_id, {}).get("private") and not authorized):
            return 404, {"error": "Repository not found", "code": "RepoNotFound"}
        revision = revision or "main"
        commit = heads.get(revision) or (revision if revision in heads.values() else None)
        if commit is None:
            return 404, {"error": f"Invalid rev id: {revision}", "code": "RevisionNotFound"}
        return 200, {"id": repo_id, "sha": commit, "private": bool(self.repos.get(repo_id, {}).get("private"))}

    def repo_operation(self, repo_id: str, op: str, revision: str, raw: bytes) -> tuple[int, dict]:
        if repo_id not in self.repos:
            return 404, {"error": "Repository not found"}
        branches = self.repos[repo_id]["branches"]
        if op == "branch":
            if revision in branches:
                return 409, {"error": "Reference already exists"}
            branches[revision] = dict(branches["main"])
            return 200, {}
        if revision not in branches:
            return 404, {"error": f"Invalid rev id: {revision}"}
        if op == "preupload":
            files = json.loads(raw)["files"]
            return 200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": None}
                                   for f in files]}
        lines = [json.loads(line) for line in raw.splitlines() if line.strip()]
        files = {item["value"]["path"]: base64.b64decode(item["value"]["content"]) for item in lines
                 if item["key"] == "file"}
        branches[revision].update(files)
        oid = hashlib.sha1(raw).hexdigest()
        self.set_head(repo_id, oid, revision)
        self.commits.append({"repo": repo_id, "revision": revision, "summary": lines[0]["value"]["summary"],
                             "files": files})
        return 200, {"commitUrl": f"{self.url}/{repo_id}/commit/{oid}", "commitOid": oid, "pullRequestUrl": None}


def _handler(hub: HubStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            auth = self.headers.get("Authorization") or ""
            with hub._lock:
                hub.authorizations.append(auth)
                if auth != f"Bearer {hub.token}":
                    status, body = 401, {"error": "Invalid credentials in Authorization header"}
                elif self.path == "/api/repos/create":
                    status, body = hub.create_repo(json.loads(raw))
                elif self.path == "/api/validate-yaml":
                    status, body = 200, {}
                elif found := REPO_PATH.match(self.path):
                    status, body = hub.repo_operation(found["repo"], found["op"], unquote(found["rev"]), raw)
                else:
                    status, body = 404, {"error": f"the stand-in does not serve {self.path}"}
            self.answer(status, body)

        def answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status >= 400:
                self.send_header("X-Error-Message", body["error"])
                if "code" in body:
                    self.send_header("X-Error-Code", body["code"])
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - model_info/dataset_info (repo_info after a refused create too)
            auth = self.headers.get("Authorization")
            found = INFO_PATH.match(self.path)
            with hub._lock:
                if auth is not None and auth != f"Bearer {hub.token}":
                    status, body = 401, {"error": "Invalid credentials in Authorization header"}
                elif found:
                    hub.info_requests.append(self.path)
                    revision = unquote(found["rev"]) if found["rev"] else None
                    status, body = hub.repo_info(found["kind"], found["repo"], revision, auth is not None)
                else:
                    status, body = 404, {"error": f"the stand-in does not serve {self.path}"}
            self.answer(status, body)

        def log_message(self, *args) -> None:  # quiet: tests read what the stand-in kept instead
            pass

    return Handler
