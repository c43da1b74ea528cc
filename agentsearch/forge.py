"""The forge adapter: pull requests, issue comments and commit statuses over the REST API of GitHub or
Gitea/Forgejo, with httpx.

GitHub and Gitea share the shapes used here: a pull request's ``head``/``base`` (``ref``, ``sha``), ``user.login``
and ``labels``; issue comments (``/issues/N/comments``, edited at ``/issues/comments/ID``); commit statuses
(``/statuses/SHA``); a collaborator's permission (``/collaborators/USER/permission``); ``GET /user``; paging by
``Link: <…>; rel="next"``. What differs, and is handled here:

- the API root: ``https://api.github.com`` (GitHub Enterprise: ``URL/api/v3``) against ``URL/api/v1``;
- the token header: ``Authorization: Bearer T`` against ``Authorization: token T``;
- the page size parameter: ``per_page`` against ``limit``;
- a neutral outcome: Gitea has a ``warning`` status; GitHub's statuses have none, so it is ``pending`` there
  (GitHub check runs, which need a GitHub App's installation token, have ``neutral``: ``check_run``);
- permissions: GitHub says ``admin|maintain|write|triage|read|none``, Gitea ``owner|admin|write|read|none``.

Every call retries a rate limit (429, or 403 with no requests left: it waits for ``Retry-After`` or the reset,
capped), a server error (5xx) and a dropped connection, with exponential backoff; anything else is a
``ForgeError`` with one line saying what the forge answered. The token is read from the environment variable
the config names and lives only in this process's memory (a trial's environment is a whitelist without it).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

from .config import ForgeConfig
from .errors import AgentsearchError

STATES = ("pending", "success", "failure", "error")  # commit status states both forges know
WRITERS = frozenset({"admin", "maintain", "write", "owner"})  # may ask the bot for work
COMMENT_CHARS = 65_000  # GitHub refuses comments over 65,536 characters
DESCRIPTION_CHARS = 140  # GitHub cuts a status description there
MAX_WAIT_S = 120.0  # the longest one wait for a rate limit's reset


class ForgeError(AgentsearchError):
    """The forge refused or failed a request (after the retries)."""


T = TypeVar("T")


def _readable(what: str, read: Callable[[Any], T], d: Any) -> T:
    """``read(d)``, or a ForgeError saying the forge's answer does not have the shape of ``what``."""
    try:
        return read(d)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ForgeError(
            f"the forge answered {what} this adapter cannot read ({type(exc).__name__}: {str(exc)[:100]})"
        ) from None


@dataclass(frozen=True)
class PullRequest:
    number: int
    title: str
    body: str
    author: str
    head_sha: str
    head_ref: str
    head_repo: str | None  # owner/name of the head's repository (a fork's, or None when it was deleted)
    base_ref: str
    base_sha: str
    labels: tuple[str, ...]
    state: str  # open | closed
    html_url: str

    @classmethod
    def of(cls, d: Any) -> PullRequest:
        return _readable("a pull request", cls._of, d)

    @classmethod
    def _of(cls, d: Mapping[str, Any]) -> PullRequest:
        head, base = d.get("head") or {}, d.get("base") or {}
        repo = head.get("repo") or {}
        state = str(d.get("state") or "")
        if d.get("merged") or d.get("merged_at"):
            state = "closed"
        return cls(
            number=int(d["number"]),
            title=str(d.get("title") or ""),
            body=str(d.get("body") or ""),
            author=str((d.get("user") or {}).get("login") or ""),
            head_sha=str(head.get("sha") or ""),
            head_ref=str(head.get("ref") or ""),
            head_repo=repo.get("full_name"),
            base_ref=str(base.get("ref") or ""),
            base_sha=str(base.get("sha") or ""),
            labels=tuple(str(x.get("name") if isinstance(x, Mapping) else x) for x in d.get("labels") or ()),
            state=state,
            html_url=str(d.get("html_url") or ""),
        )


@dataclass(frozen=True)
class Comment:
    id: int
    author: str
    body: str
    html_url: str

    @classmethod
    def of(cls, d: Any) -> Comment:
        return _readable("a comment", cls._of, d)

    @classmethod
    def _of(cls, d: Mapping[str, Any]) -> Comment:
        return cls(
            id=int(d["id"]),
            author=str((d.get("user") or {}).get("login") or ""),
            body=str(d.get("body") or ""),
            html_url=str(d.get("html_url") or ""),
        )


@dataclass(frozen=True)
class FoundPull:
    """A pull request a search found (the forge's words: untrusted text, shown escaped)."""

    number: int
    title: str
    state: str
    html_url: str

    @classmethod
    def of(cls, d: Any) -> FoundPull:
        return _readable("a search result", cls._of, d)

    @classmethod
    def _of(cls, d: Mapping[str, Any]) -> FoundPull:
        return cls(
            number=int(d["number"]),
            title=str(d.get("title") or ""),
            state=str(d.get("state") or ""),
            html_url=str(d.get("html_url") or ""),
        )


SEARCH_LIMIT = 10  # results read per query


def api_root(kind: str, url: str) -> str:
    url = url.rstrip("/")
    if kind == "gitea":
        return url + "/api/v1"
    return "https://api.github.com" if url in ("https://github.com", "https://www.github.com") else url + "/api/v3"


def repo_of_url(url: str | None) -> str | None:
    """owner/name of a git remote URL (https, ssh or scp-like) on any host, else None."""
    m = re.match(
        r"^(?:[a-z+]+://(?:[^@/]+@)?[^/]+/|[^@/:]+@[^:/]+:)(?:.*/)?([\w.-]+)/([\w.-]+?)(?:\.git)?/?$", url or ""
    )
    return f"{m.group(1)}/{m.group(2)}" if m else None


class Forge:
    """One repository on one forge, over its REST API."""

    def __init__(
        self,
        kind: str,
        url: str,
        repo: str,
        token: str,
        *,
        retries: int = 5,
        backoff_s: float = 1.0,
        timeout_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if kind not in ("github", "gitea"):
            raise AgentsearchError(f"[forge] kind {kind!r}: expected github or gitea")
        self.kind, self.url, self.repo = kind, url.rstrip("/"), repo
        self.root = api_root(kind, url)
        self.retries, self.backoff_s, self.sleep = retries, backoff_s, sleep
        scheme = "Bearer" if kind == "github" else "token"
        headers = {"Authorization": f"{scheme} {token}", "Accept": "application/json", "User-Agent": "agentsearch"}
        if kind == "github":
            headers.update({"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"})
        self._http = httpx.Client(base_url=self.root, headers=headers, timeout=timeout_s, follow_redirects=False)
        self._me: str | None = None

    @classmethod
    def from_config(
        cls, cfg: ForgeConfig, remote_url: str | None = None, env: Mapping[str, str] | None = None, **kw: Any
    ) -> Forge:
        from harness.trials import ENV_WHITELIST

        env = os.environ if env is None else env
        if cfg.token_env in ENV_WHITELIST:
            raise AgentsearchError(
                f"[forge] token_env {cfg.token_env}: every trial sees that variable; name one of your own "
                "(e.g. AGENTSEARCH_FORGE_TOKEN)"
            )
        token = env.get(cfg.token_env, "")
        if not token:
            raise AgentsearchError(
                f"no forge token: set the environment variable {cfg.token_env} (see docs/guide/forge.md for the "
                "scopes it needs), or name another in [forge] token_env"
            )
        repo = cfg.repo or repo_of_url(remote_url)
        if not repo:
            raise AgentsearchError(
                "[forge] repo is not set and the git remote's URL names no owner/name; set repo = \"owner/name\""
            )
        return cls(cfg.kind, cfg.url, repo, token, **kw)

    @property
    def identity(self) -> str:
        """How records name this repository on this forge."""
        return f"{self.kind} {self.url} {self.repo}"

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------------------------------ transport
    def _wait_for(self, r: httpx.Response, attempt: int, idempotent: bool) -> float | None:
        """Seconds to wait before retrying ``r`` (None: do not retry). A rate limit refused the request, so it is
        retried whatever it was; a server error may come after the forge did the work (a proxy's 502 after the
        comment was created), so only an idempotent request is retried then."""
        # a primary limit (no requests left) or a secondary one (GitHub: 403 or 429 with Retry-After, requests left)
        limited = r.status_code == 429 or (
            r.status_code == 403
            and (r.headers.get("x-ratelimit-remaining") == "0" or r.headers.get("retry-after") is not None)
        )
        if limited:
            after = r.headers.get("retry-after")
            if after and after.strip().isdigit():
                return min(MAX_WAIT_S, float(after))
            reset = r.headers.get("x-ratelimit-reset")
            if reset and reset.strip().isdigit():
                return min(MAX_WAIT_S, max(0.0, float(reset) - time.time()) + 1.0)
            return min(MAX_WAIT_S, self.backoff_s * 2**attempt)
        if r.status_code >= 500 and idempotent:
            return min(MAX_WAIT_S, self.backoff_s * 2**attempt)
        return None

    def request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, Any] | None = None,
        idempotent: bool | None = None,
    ) -> httpx.Response:
        """One API call, retried as ``_wait_for`` says (``idempotent``: default, every method but POST). Only a 2xx
        answer is one: a redirect (a renamed or moved repository) is an error naming where it points, never
        followed (the token would go with it)."""
        idempotent = method != "POST" if idempotent is None else idempotent
        last = ""
        for attempt in range(self.retries + 1):
            try:
                r = self._http.request(method, path, json=json, params=params)
            except httpx.TransportError as exc:
                last = f"{type(exc).__name__}: {exc}"
                if idempotent and attempt < self.retries:
                    self.sleep(min(MAX_WAIT_S, self.backoff_s * 2**attempt))
                    continue
                break
            if 200 <= r.status_code < 300:
                return r
            if 300 <= r.status_code < 400:
                where = " ".join(str(r.headers.get("location") or "nowhere").split())[:200]
                raise ForgeError(
                    f"{self.kind} {method} {path}: HTTP {r.status_code}, redirected to {where} (not followed): was the "
                    "repository renamed or moved? set [forge] url and repo to where it is now"
                )
            wait = self._wait_for(r, attempt, idempotent)
            last = f"HTTP {r.status_code}: {_message(r)}"
            if wait is None or attempt == self.retries:
                break
            self.sleep(wait)
        raise ForgeError(
            f"{self.kind} {method} {path}: {last} (after {self.retries} retries at most); check [forge] url and "
            "repo and the token's scopes"
        )

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        r = self.request(method, path, **kw)
        try:
            return r.json() if r.content else None
        except ValueError:
            raise ForgeError(f"{self.kind} {method} {path}: the answer is not JSON") from None

    def _pages(self, path: str, params: Mapping[str, Any] | None = None, limit: int = 50) -> Iterator[Any]:
        size = {"per_page" if self.kind == "github" else "limit": limit}
        url: str | None = path
        query: Mapping[str, Any] | None = {**(params or {}), **size}
        for _ in range(1000):  # a forge that pages forever is not followed forever
            if url is None:
                return
            r = self.request("GET", url, params=query)
            try:
                items = r.json()
            except ValueError:
                raise ForgeError(f"{self.kind} GET {path}: the answer is not JSON") from None
            if not isinstance(items, list):
                raise ForgeError(f"{self.kind} GET {path}: expected a list")
            yield from items
            url = _next_link(r.headers.get("link"), self.root)
            query = None  # the next link carries the query

    # ------------------------------------------------------------------------------------------ the API
    def me(self) -> str:
        """The token's own login: our comments are the ones this account wrote."""
        if self._me is None:
            d = self._json("GET", "/user")
            self._me = str(d.get("login") or "") if isinstance(d, dict) else ""
            if not self._me:
                raise ForgeError(f"{self.kind} GET /user: no login in the answer")
        return self._me

    def pulls(self, state: str = "open") -> tuple[list[PullRequest], list[str]]:
        """(the pull requests, one line for each the forge listed but this adapter cannot read)."""
        prs, bad = [], []
        for d in self._pages(f"/repos/{self.repo}/pulls", {"state": state}):
            try:
                prs.append(PullRequest.of(d))
            except ForgeError as exc:
                bad.append(str(exc))
        return prs, bad

    def search_pulls(self, terms: str, state: str = "open") -> list[FoundPull]:
        """The first ``SEARCH_LIMIT`` pull requests of the repository in ``state`` whose text matches ``terms``:
        GitHub's issue search (``repo:… is:pr is:open terms``), Gitea's issue list (``type=pulls&q=terms``)."""
        if self.kind == "github":
            q = f"repo:{self.repo} is:pr is:{state} {terms}"
            d = self._json("GET", "/search/issues", params={"q": q, "per_page": SEARCH_LIMIT})
            items = d.get("items") if isinstance(d, dict) else None
        else:
            params = {"type": "pulls", "state": state, "q": terms, "limit": SEARCH_LIMIT}
            items = self._json("GET", f"/repos/{self.repo}/issues", params=params)
        if not isinstance(items, list):
            raise ForgeError(f"{self.kind} search of pull requests: expected a list of results")
        return [FoundPull.of(d) for d in items[:SEARCH_LIMIT]]

    def pull(self, number: int) -> PullRequest:
        return PullRequest.of(self._json("GET", f"/repos/{self.repo}/pulls/{int(number)}"))

    def create_pull(self, head: str, base: str, title: str, body: str, draft: bool = False) -> PullRequest:
        data: dict[str, Any] = {"head": head, "base": base, "title": title, "body": body}
        if draft and self.kind == "github":
            data["draft"] = True
        return PullRequest.of(self._json("POST", f"/repos/{self.repo}/pulls", json=data))

    def edit_pull(self, number: int, title: str, body: str) -> PullRequest:
        return PullRequest.of(
            self._json("PATCH", f"/repos/{self.repo}/pulls/{int(number)}", json={"title": title, "body": _cap(body)})
        )

    def close_pull(self, number: int) -> PullRequest:
        """Close a pull request (the review bot merged its judged tree as its own commit: the forge does not see the
        head merged)."""
        return PullRequest.of(self._json("PATCH", f"/repos/{self.repo}/pulls/{int(number)}", json={"state": "closed"}))

    def comments(self, number: int) -> list[Comment]:
        """The PR's comments, oldest first; one this adapter cannot read is left out (it can be no command and no
        comment of ours: we only ever read what we wrote through the same shapes)."""
        out = []
        for d in self._pages(f"/repos/{self.repo}/issues/{int(number)}/comments"):
            try:
                out.append(Comment.of(d))
            except ForgeError:
                continue
        return out

    def comment(self, comment_id: int) -> Comment | None:
        try:
            return Comment.of(self._json("GET", f"/repos/{self.repo}/issues/comments/{int(comment_id)}"))
        except ForgeError as exc:
            if "HTTP 404" in str(exc):
                return None
            raise

    def create_comment(self, number: int, body: str) -> Comment:
        return Comment.of(
            self._json("POST", f"/repos/{self.repo}/issues/{int(number)}/comments", json={"body": _cap(body)})
        )

    def edit_comment(self, comment_id: int, body: str) -> Comment:
        return Comment.of(
            self._json("PATCH", f"/repos/{self.repo}/issues/comments/{int(comment_id)}", json={"body": _cap(body)})
        )

    def set_status(self, sha: str, outcome: str, context: str, description: str, target_url: str | None = None) -> None:
        """``outcome``: success | failure | error | pending | neutral (pending on GitHub, warning on Gitea)."""
        state = {"neutral": "warning" if self.kind == "gitea" else "pending"}.get(outcome, outcome)
        if state not in (*STATES, "warning"):
            raise AgentsearchError(f"unknown commit status {outcome!r}")
        desc = " ".join(description.split())
        data = {
            "state": state,
            "context": context,
            "description": desc if len(desc) <= DESCRIPTION_CHARS else desc[: DESCRIPTION_CHARS - 1] + "…",
        }
        if target_url:
            data["target_url"] = target_url
        self._json(
            "POST", f"/repos/{self.repo}/statuses/{sha}", json=data, idempotent=True
        )  # a second one only repeats it

    def check_run(
        self, sha: str, name: str, outcome: str | None, title: str, summary: str, details_url: str | None = None
    ) -> None:
        """GitHub only (a GitHub App's installation token): a check run on ``sha``; ``outcome`` None: in progress,
        else completed with success, failure, neutral or (error) action_required."""
        if self.kind != "github":
            raise AgentsearchError("check runs are GitHub's; Gitea has commit statuses only")
        data: dict[str, Any] = {
            "name": name,
            "head_sha": sha,
            "output": {"title": title[:250], "summary": _cap(summary)},
        }
        if outcome is None:
            data["status"] = "in_progress"
        else:
            data.update(status="completed", conclusion={"error": "action_required"}.get(outcome, outcome))
        if details_url:
            data["details_url"] = details_url
        try:
            self._json(
                "POST", f"/repos/{self.repo}/check-runs", json=data, idempotent=True
            )  # the latest of a name counts
        except ForgeError as exc:
            if "HTTP 403" in str(exc):
                raise ForgeError(
                    "GitHub refused the check run (HTTP 403): check runs need a GitHub App's installation token; "
                    "use one, or set [forge] check_runs = false (the commit status stays)"
                ) from None
            raise

    def statuses(self, sha: str) -> list[dict[str, Any]]:
        return list(self._pages(f"/repos/{self.repo}/commits/{sha}/statuses"))

    def permission(self, user: str) -> str:
        """The user's permission on the repository ('none' when the forge says they are no collaborator)."""
        try:
            d = self._json("GET", f"/repos/{self.repo}/collaborators/{user}/permission")
        except ForgeError as exc:
            if "HTTP 404" in str(exc) or "HTTP 403" in str(exc):
                return "none"
            raise
        if not isinstance(d, dict):
            raise ForgeError(f"{self.kind} GET /repos/{self.repo}/collaborators/{user}/permission: expected an object")
        return str(d.get("permission") or "none")

    def can_write(self, user: str) -> bool:
        return self.permission(user) in WRITERS

    def raw_url(self, commit: str, name: str) -> str:
        """Where the forge serves a file of a pushed commit (plots for a PR body)."""
        if self.kind == "gitea":
            return f"{self.url}/{self.repo}/raw/commit/{commit}/{name}"
        return f"{self.url}/{self.repo}/raw/{commit}/{name}"


def _next_link(header: str | None, root: str) -> str | None:
    for part in (header or "").split(","):
        m = re.match(r'\s*<([^>]+)>\s*;\s*rel="?next"?', part)
        if m:
            link = m.group(1)
            if not link.startswith(root):  # a next page on another host is not followed (the token would go with it)
                return None
            return link[len(root) :] or "/"
    return None


def _message(r: httpx.Response) -> str:
    try:
        d = r.json()
    except ValueError:
        d = None
    msg = d.get("message") if isinstance(d, dict) else None
    text = str(msg or r.text or r.reason_phrase)
    text = " ".join(text.split())
    return text if len(text) <= 200 else text[:199] + "…"


def _cap(body: str) -> str:
    if len(body) <= COMMENT_CHARS:
        return body
    return (
        body[: COMMENT_CHARS - 80].rstrip()
        + "\n\n…(cut at the forge's comment limit: the full report is `agentsearch report`)\n"
    )
