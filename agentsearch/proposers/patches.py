"""The patch-queue proposer: human patches (``*.patch``/``*.diff``) or existing branches.

Patches are `git format-patch` mails or plain unified diffs; a branch becomes the diff from
its merge-base with the baseline to its tip (so it, too, is re-applied on whatever the
baseline is when its turn comes). The queue is fixed when the episode starts: its items,
with their full text, are the manifest recorded in the history.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from history.records import text as clean_text

from ..workspace import git
from .base import CATEGORIES, Candidate, Context, ProposerError

SUFFIXES = (".patch", ".diff")


def subject(raw: str) -> str:
    """A mail's Subject as text: its RFC 2047 encoded words (``=?utf-8?q?...?=``, what `git format-patch` writes
    for a non-ASCII subject) decoded, then cleaned to one line; the raw value, cleaned, when they do not decode."""
    from email.errors import HeaderParseError
    from email.header import decode_header, make_header

    folded = " ".join(raw.split())
    try:
        chunks = decode_header(folded)
    except (HeaderParseError, ValueError):
        return clean_text.title(folded)
    try:
        decoded = str(make_header(chunks))
    except (HeaderParseError, LookupError, UnicodeError, ValueError):  # a charset Python lacks: each word as UTF-8
        decoded = " ".join(
            c if isinstance(c, str) else c.decode(cs if cs and _known(cs) else "utf-8", "replace") for c, cs in chunks
        )
    return clean_text.title(decoded)


def _known(charset: str) -> bool:
    import codecs

    try:
        codecs.lookup(charset)
    except LookupError:
        return False
    return True


def describe_mail(text: str, fallback: str) -> tuple[str, str, str]:
    """(title, rationale, category) from a format-patch mail or a commit message."""
    title, body = fallback, ""
    m = re.search(r"^Subject: (.+(?:\n[ \t].+)*)", text, re.M)
    if m:
        title = re.sub(r"^\[[^\]]*\]\s*", "", subject(m.group(1)))
        rest = text[m.end() :]
        body = rest.split("\n---\n", 1)[0] if "\n---\n" in rest else ""
        body = re.split(r"^diff --git ", body, maxsplit=1, flags=re.M)[0]
    category = "other"
    c = re.search(r"^Category:\s*(\S+)", text, re.M)
    if c and c.group(1).lower() in CATEGORIES:
        category = c.group(1).lower()
    body = re.sub(r"^Category:.*$", "", body, flags=re.M).strip()
    return title.strip() or fallback, body, category


@dataclass(frozen=True)
class Item:
    key: str
    title: str
    rationale: str
    category: str
    patch: str
    source: str


class PatchQueue:
    name = "patches"

    def __init__(self, items: list[Item], source: str):
        self.items = items
        self.source = source

    # ------------------------------------------------------------------ building
    @classmethod
    def from_options(cls, options: Mapping[str, Any], repo_dir: Path) -> PatchQueue:
        patches, branches = options.get("patches"), options.get("branches")
        if bool(patches) == bool(branches):
            raise ProposerError("the patch-queue proposer needs exactly one of --patches DIR or --branches GLOB")
        if patches:
            return cls.from_dir(Path(patches))
        return cls.from_branches(repo_dir, str(branches), str(options.get("baseline") or "HEAD"))

    @classmethod
    def from_dir(cls, directory: Path) -> PatchQueue:
        if not directory.is_dir():
            raise ProposerError(
                f"{directory}: no such patch directory; pass --patches DIR with *.patch or *.diff files"
            )
        files = sorted(p for p in directory.iterdir() if p.suffix in SUFFIXES and p.is_file())
        if not files:
            raise ProposerError(f"{directory}: no *.patch or *.diff files in it")
        items = []
        for f in files:
            try:
                text = f.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise ProposerError(f"{f}: cannot read the patch ({exc})") from None
            title, rationale, category = describe_mail(text, f.stem)
            digest = hashlib.sha256(text.encode()).hexdigest()[:12]
            items.append(Item(f"patch:{f.name}@{digest}", title, rationale, category, text, str(f)))
        return cls(items, str(directory))

    @classmethod
    def from_branches(cls, repo_dir: Path, pattern: str, baseline: str) -> PatchQueue:
        rows = [
            (b, s)
            for b, s in git.branches_matching(repo_dir, pattern)
            if not b.startswith("agentsearch/") and b != baseline
        ]
        if not rows:
            raise ProposerError(f"no branch matches {pattern!r}; list them with `git branch --list {pattern!r}`")
        items = []
        for branch, sha in rows:
            base = git.merge_base(repo_dir, baseline, sha)
            if base is None:
                raise ProposerError(f"branch {branch!r} shares no history with {baseline!r}")
            patch = git.diff_text(repo_dir, base, sha)
            msg = git.commit_message(repo_dir, sha)
            first, _, rest = msg.partition("\n")
            _, _, category = describe_mail(msg, branch)
            rest = re.sub(r"^(Category|Agentsearch-[\w-]+):.*$", "", rest, flags=re.M).strip()
            items.append(Item(f"branch:{branch}@{sha[:12]}", first.strip() or branch, rest, category, patch, branch))
        return cls(items, pattern)

    @classmethod
    def from_manifest(cls, manifest: Mapping[str, Any]) -> PatchQueue:
        items = [Item(**i) for i in manifest["items"]]
        return cls(items, manifest.get("source", ""))

    def manifest(self) -> dict[str, Any]:
        return {"source": self.source, "items": [i.__dict__ for i in self.items]}

    # ------------------------------------------------------------------ proposing
    def next(self, judged: set[str], ctx: Context | None = None) -> Candidate | None:
        for i in self.items:
            if i.key not in judged:
                return Candidate(i.key, i.title, i.rationale, i.category, self.name, i.patch)
        return None

    def __len__(self) -> int:
        return len(self.items)
