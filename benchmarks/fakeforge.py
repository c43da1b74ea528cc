"""A small forge on loopback: the subset of the GitHub and Gitea REST APIs the review bot speaks, over a real HTTP
server, with pull request heads in a real bare git repository (refs/pull/N/head, as both forges keep them).

It keeps pull requests, comments and commit statuses in memory, checks the token and its scheme (GitHub:
``Bearer``, Gitea: ``token``), pages lists with ``Link`` headers, refuses an edit of someone else's comment and a
status state its kind does not know, and can be told to fail the next requests (``faults``) or to rate-limit.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

STATES = {
    "github": {"pending", "success", "failure", "error"},
    "gitea": {"pending", "success", "failure", "error", "warning"},
}


class FakeForge:
    def __init__(
        self,
        bare: Path,
        kind: str = "github",
        repo: str = "acme/fork",
        bot: str = "agentsearch-bot",
        token: str = "tok-" + "s3cret-forge-token",
    ) -> None:
        self.bare, self.kind, self.repo, self.bot, self.token = bare, kind, repo, bot, token
        self.tokens = {token: bot}
        self.permissions: dict[str, str] = {bot: "write", "maintainer": "admin" if kind == "github" else "owner"}
        self.prs: dict[int, dict[str, Any]] = {}
        self.comments: dict[int, dict[str, Any]] = {}
        self.statuses: dict[str, list[dict[str, Any]]] = {}
        self.check_runs: dict[str, list[dict[str, Any]]] = {}
        self.app_tokens: set[str] = set()  # tokens that may create check runs (a GitHub App's installation tokens)
        self.faults: list[tuple[int, dict[str, str]]] = []  # (status, headers) answered to the next requests
        self.log: list[tuple[str, str]] = []
        self.searches: list[str] = []  # the queries of pull-request searches, as asked
        self.lock = threading.Lock()
        self._next_id = 1000
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # ---------------------------------------------------------------------------- the test's side
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> FakeForge:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _git(self, *args: str) -> str:
        return subprocess.run(["git", *args], cwd=self.bare, check=True, capture_output=True, text=True).stdout.strip()

    def open_pr(
        self,
        branch: str,
        base: str = "main",
        title: str = "A change",
        body: str = "",
        author: str = "contributor",
        labels: tuple[str, ...] = (),
    ) -> int:
        """A pull request from ``branch`` of the bare repository (pushed by the test) into ``base``."""
        with self.lock:
            number = len(self.prs) + 1
            self.prs[number] = {
                "number": number,
                "title": title,
                "body": body,
                "state": "open",
                "user": {"login": author},
                "labels": [{"name": x} for x in labels],
                "head": {"ref": branch, "sha": "", "repo": {"full_name": self.repo}},
                "base": {
                    "ref": base,
                    "sha": self._git("rev-parse", f"refs/heads/{base}"),
                    "repo": {"full_name": self.repo},
                },
                "html_url": f"{self.url}/{self.repo}/pull/{number}",
            }
        self.pushed(number)
        return number

    def pushed(self, number: int) -> str:
        """The PR's branch moved (the test pushed to it): its head and refs/pull/N/head follow."""
        pr = self.prs[number]
        sha = self._git("rev-parse", f"refs/heads/{pr['head']['ref']}")
        self._git("update-ref", f"refs/pull/{number}/head", sha)
        pr["head"]["sha"] = sha
        return sha

    def add_comment(self, number: int, author: str, body: str) -> int:
        with self.lock:
            return self._comment(number, author, body)["id"]

    def ours(self, number: int) -> list[dict[str, Any]]:
        return [c for c in self.comments.values() if c["issue"] == number and c["user"]["login"] == self.bot]

    def status(self, sha: str, context: str = "agentsearch") -> dict[str, Any] | None:
        return next((s for s in reversed(self.statuses.get(sha, [])) if s["context"] == context), None)

    # ---------------------------------------------------------------------------- the API's side
    def _comment(self, number: int, author: str, body: str) -> dict[str, Any]:
        self._next_id += 1
        c = {
            "id": self._next_id,
            "issue": number,
            "user": {"login": author},
            "body": body,
            "html_url": f"{self.url}/{self.repo}/pull/{number}#issuecomment-{self._next_id}",
        }
        self.comments[c["id"]] = c
        return c

    def handle(
        self, method: str, path: str, query: dict[str, str], headers: Any, body: Any
    ) -> tuple[int, Any, dict[str, str]]:
        self.log.append((method, path))
        if self.faults:
            status, extra = self.faults.pop(0)
            return status, {"message": f"injected {status}"}, extra
        scheme = "Bearer" if self.kind == "github" else "token"
        auth = headers.get("Authorization") or ""
        login = self.tokens.get(auth[len(scheme) + 1 :]) if auth.startswith(scheme + " ") else None
        if login is None:
            return 401, {"message": "Bad credentials"}, {}
        prefix = "/api/v3" if self.kind == "github" else "/api/v1"
        if not path.startswith(prefix):
            return 404, {"message": "Not Found"}, {}
        path = path[len(prefix) :]
        if path == "/user":
            return 200, {"login": login}, {}
        if path == "/search/issues" and method == "GET" and self.kind == "github":
            words = query.get("q", "").split()
            self.searches.append(query.get("q", ""))
            scope = {w.split(":", 1)[0]: w.split(":", 1)[1] for w in words if ":" in w}
            if scope.get("repo") != self.repo or scope.get("is") not in ("pr", "open", "closed"):
                return 422, {"message": "Validation Failed: the search names no repository of this forge"}, {}
            with self.lock:
                found = self._search([w for w in words if ":" not in w], "open" if "is:open" in words else "all")
            return 200, {"total_count": len(found), "items": found[: int(query.get("per_page", "30"))]}, {}
        m = re.fullmatch(rf"/repos/{re.escape(self.repo)}(/.*)", path)
        if m is None:
            return 404, {"message": "Not Found"}, {}
        rest = m.group(1)
        with self.lock:
            return self._route(method, rest, query, login, body)

    def _page(self, items: list[Any], path: str, query: dict[str, str]) -> tuple[int, Any, dict[str, str]]:
        size = int(query.get("per_page" if self.kind == "github" else "limit", "30"))
        page = int(query.get("page", "1"))
        chunk = items[(page - 1) * size : page * size]
        headers = {}
        if page * size < len(items):
            q = {k: v for k, v in query.items() if k != "page"}
            q["page"] = str(page + 1)
            prefix = "/api/v3" if self.kind == "github" else "/api/v1"
            headers["Link"] = (
                f'<{self.url}{prefix}/repos/{self.repo}{path}?'
                + "&".join(f"{k}={v}" for k, v in q.items())
                + '>; rel="next"'
            )
        return 200, chunk, headers

    def _search(self, terms: list[str], state: str) -> list[dict[str, Any]]:
        """Pull requests whose title or body holds every term (case-insensitive), as issue-shaped results."""
        terms = [t.strip('"').lower() for t in terms if t.strip('"')]
        return [
            {
                "number": p["number"],
                "title": p["title"],
                "state": p["state"],
                "html_url": p["html_url"],
                "pull_request": {},
            }
            for p in self.prs.values()
            if (state == "all" or p["state"] == state)
            and all(t in (p["title"] + "\n" + p["body"]).lower() for t in terms)
        ]

    def _route(
        self, method: str, rest: str, query: dict[str, str], login: str, body: Any
    ) -> tuple[int, Any, dict[str, str]]:
        if rest == "/issues" and method == "GET" and self.kind == "gitea" and query.get("type") == "pulls":
            self.searches.append(query.get("q", ""))
            found = self._search(query.get("q", "").split(), query.get("state", "open"))
            return 200, found[: int(query.get("limit", "30"))], {}
        if rest == "/pulls" and method == "GET":
            state = query.get("state", "open")
            return self._page([p for p in self.prs.values() if state == "all" or p["state"] == state], rest, query)
        if rest == "/pulls" and method == "POST":
            if any(p["head"]["ref"] == body.get("head") and p["state"] == "open" for p in self.prs.values()):
                return 422, {"message": f"A pull request already exists for {body.get('head')}."}, {}
            try:
                sha = self._git("rev-parse", f"refs/heads/{body['head']}")
            except subprocess.CalledProcessError:
                return 422, {"message": f"head {body.get('head')!r} does not exist"}, {}
            number = len(self.prs) + 1
            self.prs[number] = {
                "number": number,
                "title": body["title"],
                "body": body.get("body", ""),
                "state": "open",
                "user": {"login": login},
                "labels": [],
                "draft": bool(body.get("draft")),
                "head": {"ref": body["head"], "sha": sha, "repo": {"full_name": self.repo}},
                "base": {
                    "ref": body["base"],
                    "sha": self._git("rev-parse", f"refs/heads/{body['base']}"),
                    "repo": {"full_name": self.repo},
                },
                "html_url": f"{self.url}/{self.repo}/pull/{number}",
            }
            self._git("update-ref", f"refs/pull/{number}/head", sha)
            return 201, self.prs[number], {}
        m = re.fullmatch(r"/pulls/(\d+)", rest)
        if m and method == "GET":
            pr = self.prs.get(int(m.group(1)))
            return (200, pr, {}) if pr else (404, {"message": "Not Found"}, {})
        if m and method == "PATCH":
            pr = self.prs.get(int(m.group(1)))
            if pr is None:
                return 404, {"message": "Not Found"}, {}
            if pr["user"]["login"] != login and self.permissions.get(login) not in ("write", "admin", "owner"):
                return 403, {"message": "Must have write access to edit a pull request"}, {}
            pr.update({k: str(body[k]) for k in ("title", "body") if k in body})
            if "state" in body:
                if body["state"] not in ("open", "closed"):
                    return 422, {"message": f"invalid state {body['state']!r}"}, {}
                pr["state"] = body["state"]
            pr["head"]["sha"] = self._git("rev-parse", f"refs/heads/{pr['head']['ref']}")
            return 200, pr, {}
        m = re.fullmatch(r"/issues/(\d+)/comments", rest)
        if m:
            number = int(m.group(1))
            if number not in self.prs:
                return 404, {"message": "Not Found"}, {}
            if method == "GET":
                return self._page([c for c in self.comments.values() if c["issue"] == number], rest, query)
            if method == "POST":
                return 201, self._comment(number, login, str(body["body"])), {}
        m = re.fullmatch(r"/issues/comments/(\d+)", rest)
        if m:
            c = self.comments.get(int(m.group(1)))
            if c is None:
                return 404, {"message": "Not Found"}, {}
            if method == "GET":
                return 200, c, {}
            if method == "PATCH":
                if c["user"]["login"] != login:
                    return 403, {"message": "Must have admin rights to edit another user's comment"}, {}
                c["body"] = str(body["body"])
                return 200, c, {}
        m = re.fullmatch(r"/statuses/([0-9a-f]{40})", rest)
        if m and method == "POST":
            if body.get("state") not in STATES[self.kind]:
                return 422, {"message": f"invalid state {body.get('state')!r}"}, {}
            if len(body.get("description") or "") > 140:
                return 422, {"message": "description is too long (maximum is 140 characters)"}, {}
            s = {k: body.get(k) for k in ("state", "context", "description", "target_url")}
            self.statuses.setdefault(m.group(1), []).append(s)
            return 201, s, {}
        if rest == "/check-runs" and method == "POST" and self.kind == "github":
            if login not in {self.tokens[t] for t in self.app_tokens}:
                return 403, {"message": "Resource not accessible by personal access token"}, {}
            if body.get("status") == "completed" and body.get("conclusion") not in (
                "success",
                "failure",
                "neutral",
                "action_required",
            ):
                return 422, {"message": f"invalid conclusion {body.get('conclusion')!r}"}, {}
            if body.get("conclusion") == "action_required" and not body.get("details_url"):
                return 422, {"message": "details_url is required for action_required"}, {}
            run = {k: body.get(k) for k in ("name", "status", "conclusion", "output", "details_url")}
            self.check_runs.setdefault(str(body.get("head_sha")), []).append(run)
            return 201, run, {}
        m = re.fullmatch(r"/commits/([0-9a-f]{40})/statuses", rest)
        if m and method == "GET":
            return self._page(list(reversed(self.statuses.get(m.group(1), []))), rest, query)
        m = re.fullmatch(r"/collaborators/([^/]+)/permission", rest)
        if m and method == "GET":
            perm = self.permissions.get(m.group(1))
            return (200, {"permission": perm}, {}) if perm else (404, {"message": "Not a collaborator"}, {})
        return 404, {"message": "Not Found"}, {}


def _handler(forge: FakeForge) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def _go(self, method: str) -> None:
            u = urlparse(self.path)
            query = {k: v[-1] for k, v in parse_qs(u.query).items()}
            n = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(n)) if n else None
            status, data, headers = forge.handle(method, u.path, query, self.headers, body)
            raw = json.dumps(data).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(raw)

        def do_GET(self) -> None:
            self._go("GET")

        def do_POST(self) -> None:
            self._go("POST")

        def do_PATCH(self) -> None:
            self._go("PATCH")

    return Handler
