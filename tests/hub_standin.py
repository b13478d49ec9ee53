"""A local stand-in for the Hugging Face Hub's HTTP API, because no hub is reachable from this machine or from CI.

tuneline publishes through huggingface_hub's public API (create_repo, create_branch, upload_folder) unchanged; this
server answers only the requests those calls send, as read from the installed huggingface_hub:
- POST /api/repos/create                      -> the repo's URL (409 with the URL when it exists)
- POST /api/models/{repo}/branch/{branch}     -> a branch from main (409 when it exists)
- POST /api/models/{repo}/preupload/{rev}     -> "regular" for every file, so no LFS or Xet storage is needed
- POST /api/models/{repo}/commit/{rev}        -> NDJSON: a header line, then each file base64-encoded
- POST /api/validate-yaml                     -> the README check huggingface_hub makes without hf_xet
A wrong or missing token gets 401, as the hub answers it. What it received is kept for tests to assert on.
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


class HubStandIn:
    """`with HubStandIn(token) as hub:` serves on 127.0.0.1 at `hub.url` until the block ends."""

    def __init__(self, token: str, user: str = "standin-user"):
        self.token, self.user = token, user
        self.repos: dict[str, dict] = {}  # repo id -> {"private": bool, "branches": {name: {path: bytes}}}
        self.commits: list[dict] = []  # {"repo", "revision", "summary", "files"} in order
        self.authorizations: list[str] = []  # every Authorization header received
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

    # --- the endpoints: (status, JSON body)
    def create_repo(self, body: dict) -> tuple[int, dict]:
        repo_id = f"{body.get('organization') or self.user}/{body['name']}"
        answer = {"url": f"{self.url}/{repo_id}", "name": repo_id}
        if repo_id in self.repos:
            return 409, {**answer, "error": "You already created this model repo"}
        self.repos[repo_id] = {"private": body.get("visibility") == "private", "branches": {"main": {}}}
        return 200, answer

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
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status >= 400:
                self.send_header("X-Error-Message", body["error"])
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802 - repo_info, which huggingface_hub asks after a refused create
            ok = self.headers.get("Authorization") == f"Bearer {hub.token}"
            self.send_response(404 if ok else 401)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args) -> None:  # quiet: tests read what the stand-in kept instead
            pass

    return Handler
