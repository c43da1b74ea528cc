"""Pull requests an upstream project would accept: `agentsearch pr` with ``[forge] upstream`` (or ``--upstream``).

vLLM's rules for AI-assisted contributions (its ``AGENTS.md``) forbid pure code-agent pull requests: a named human
submits the change and defends it end to end. The description must say why it does not duplicate an open pull
request (with the searches run), the test commands and their results, model-evaluation results when the change
can affect output or serving, and that AI assistance was used; commits carry ``Co-authored-by:`` trailers (and
``Signed-off-by:``, the DCO every vLLM commit needs).

agentsearch has each of these facts in a judged proposal's evidence. This module puts them in that form: the owner
(``Owner``), the duplicate search through the forge adapter (``search``), the upstream branch (``upstream_commit``:
one commit holding exactly the judged tree, written by the owner, with the trailers) and what the body template of
the profile is given (``body_context``). Everything a proposal controls (its title, its rationale, the paths it
changed) reaches the forge's search as cleaned terms and the body as escaped text; no trailer can come from it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from history.records import text

from .config import OWNER_RE, UPSTREAMS, Config
from .errors import AgentsearchError
from .workspace import git


@dataclass(frozen=True)
class Profile:
    """One upstream project's rules, as far as a pull request's form goes."""

    name: str
    project: str  # how the body names the project
    rules: str  # where its rules are written
    template: str  # the body's template (templates/)
    tags: Mapping[str, str]  # proposal category -> the title's tag
    signoff: bool  # every commit needs Signed-off-by: (a DCO check)
    kernel_benchmarks: str  # where the project keeps kernel micro-benchmarks


PROFILES: dict[str, Profile] = {
    "vllm": Profile(
        name="vllm",
        project="vLLM",
        rules="https://github.com/vllm-project/vllm/blob/main/AGENTS.md",
        template="pr_vllm.md.j2",
        tags={"kernel": "[Kernel][Perf]", "scheduling": "[Core][Perf]", "memory": "[Core][Perf]"},
        signoff=True,
        kernel_benchmarks="benchmarks/kernels/",
    )
}
assert tuple(PROFILES) == UPSTREAMS, "agentsearch.config.UPSTREAMS names the profiles defined here"

# who wrote a proposal, as a co-author trailer: an agent by its vendor's address; a program of ours by name
AGENT_COAUTHORS = {"claude": "Claude <noreply@anthropic.com>"}
TOOL_COAUTHOR = "agentsearch {proposer} proposer <agentsearch@users.noreply.github.com>"
HUMAN_PROPOSERS = ("patches",)  # a patch queue: the patch's own author wrote it
SEARCH_TERMS = 3  # duplicate searches per pull request
TERM_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:[.-][A-Za-z0-9_]+)*")
STOP_WORDS = frozenset(
    "the and for with from into than that this make makes made faster slower use uses using default true false "
    "when each more less instead".split()
)
BRANCH_PREFIX = "agentsearch/upstream/"


def profile_of(name: str) -> Profile:
    if name not in PROFILES:
        raise AgentsearchError(f"unknown upstream {name!r}: expected one of {', '.join(PROFILES)}")
    return PROFILES[name]


@dataclass(frozen=True)
class Owner:
    """The human who submits and vouches for an upstream pull request."""

    name: str
    email: str

    @classmethod
    def of(cls, value: str, project: str) -> Owner:
        """``Name <email>`` (from --owner or [forge] owner); a missing or malformed one refused in one line."""
        value = (value or "").strip()
        if not value:
            raise AgentsearchError(
                f"an upstream pull request to {project} needs a named human owner who has reviewed every changed line "
                "and vouches for it (pure code-agent pull requests are not allowed): pass --owner 'Name <email>' or "
                "set [forge] owner"
            )
        if not OWNER_RE.fullmatch(value):
            raise AgentsearchError(f"--owner {value!r}: expected `Name <email>`, as git writes an author")
        name, email = value[:-1].rsplit(" <", 1)
        return cls(name.strip(), email)

    def __str__(self) -> str:
        return f"{self.name} <{self.email}>"


def coauthor(proposer: str, patch: str) -> str:
    """The ``Co-authored-by:`` value for whoever wrote the change: an agent by its vendor's address, a patch queue's
    patch by its ``From:`` line (as `git format-patch` wrote it), a proposer program of agentsearch by its name."""
    if proposer in AGENT_COAUTHORS:
        return AGENT_COAUTHORS[proposer]
    if proposer in HUMAN_PROPOSERS:
        m = re.search(r"^From: (.+)$", patch[:4000], re.M)
        author = text.clean(m.group(1), 200, one_line=True) if m else ""
        if OWNER_RE.fullmatch(author):
            return author
    return TOOL_COAUTHOR.format(proposer=re.sub(r"[^a-z0-9-]", "-", proposer.lower())[:40])


def search_terms(title: str, files: Sequence[str]) -> list[str]:
    """At most ``SEARCH_TERMS`` terms for the duplicate search: the identifiers the title names (a knob, a function,
    a module: words with ``_`` or ``.``), then the changed modules' names, then the title's longest words. Only
    letters, digits, ``_``, ``.`` and ``-``: nothing a proposal writes becomes a search qualifier (``repo:``, ``is:``)
    or leaves the query."""
    words = TERM_RE.findall(text.clean(title, 300, one_line=True))
    named = [w for w in words if ("_" in w or "." in w) and len(w) >= 4]
    modules = [Path(f).stem for f in files if f.endswith(".py") and Path(f).stem not in ("__init__", "setup")]
    plain = sorted(
        (w for w in words if len(w) >= 5 and w.isalpha() and w.lower() not in STOP_WORDS), key=lambda w: -len(w)
    )
    terms: list[str] = []
    for w in [*named, *modules, *plain]:
        w = w.strip(".-")[:60]
        if w and w.lower() not in (t.lower() for t in terms):
            terms.append(w)
    return terms[:SEARCH_TERMS]


@dataclass(frozen=True)
class Search:
    """One duplicate search: the term asked and the open pull requests the forge found (None: not run)."""

    term: str
    found: tuple[Any, ...] | None  # agentsearch.forge.FoundPull

    def to_json(self) -> dict[str, Any]:
        return {
            "term": self.term,
            "found": None if self.found is None else [{"number": f.number, "title": f.title} for f in self.found],
        }


def search(forge: Any, terms: Sequence[str]) -> list[Search]:
    """Each term through the forge adapter (``forge`` None: a dry run, not run). A failed search is the run's
    error: the rules ask for it, so no pull request is opened without it."""
    from .forge import ForgeError

    if forge is None:
        return [Search(t, None) for t in terms]
    out = []
    for t in terms:
        try:
            out.append(Search(t, tuple(forge.search_pulls(t))))
        except ForgeError as exc:
            raise AgentsearchError(
                f"the duplicate search for {t!r} failed ({exc}); an upstream pull request needs it — try again"
            ) from None
    return out


def refuse_duplicates(searches: Sequence[Search], not_duplicate: str) -> None:
    """Open pull requests matched: the owner must say why this is not one of them (--not-duplicate)."""
    hits = {f.number: f for s in searches for f in (s.found or ())}
    if hits and not not_duplicate.strip():
        shown = ", ".join(f"#{n} {text.clean(f.title, 60, one_line=True)!r}" for n, f in list(hits.items())[:3])
        more = f" and {len(hits) - 3} more" if len(hits) > 3 else ""
        raise AgentsearchError(
            f"the duplicate search found {len(hits)} open pull request(s): {shown}{more}; read them, then pass "
            "--not-duplicate 'why this is not one of them' (or do not open another)"
        )


def serving_only(files: Sequence[str], config: Config) -> bool:
    """True when a change touches nothing but the fork's own configuration (its serving file and agentsearch.toml):
    a deployment setting, no code the upstream has."""
    own = {config.sweep.file, "agentsearch.toml"}
    return bool(files) and all(f in own for f in files)


def commit_message(subject: str, summary: str, coauthored: str, owner: Owner, signoff: bool) -> str:
    """The upstream commit's message: the subject (one cleaned line: a title cannot add a paragraph, let alone a
    trailer), our summary, then the trailers as the last paragraph."""
    lines = [text.clean(subject, 72, one_line=True), "", summary.strip(), "", f"Co-authored-by: {coauthored}"]
    if signoff:
        lines.append(f"Signed-off-by: {owner}")
    return "\n".join(lines) + "\n"


def upstream_commit(
    repo_dir: Path,
    baseline: str,
    candidate: str,
    message: str,
    owner: Owner,
    extra: tuple[str, str] | None = None,
    scratch: Path | None = None,
) -> str:
    """One commit on ``baseline`` holding exactly ``candidate``'s tree (what the gate judged) — plus, for a kernel,
    ``extra`` (path, text: its micro-benchmark in the upstream's layout, a file no engine imports) — written and
    committed by the owner. What it holds is checked before it is returned: the judged tree, and nothing else but
    ``extra``."""
    who = {
        "GIT_AUTHOR_NAME": owner.name,
        "GIT_AUTHOR_EMAIL": owner.email,
        "GIT_COMMITTER_NAME": owner.name,
        "GIT_COMMITTER_EMAIL": owner.email,
    }
    if extra is None:
        tree = git.tree_of(repo_dir, candidate)
    else:
        assert scratch is not None, "a tree with an extra file is built in a scratch directory"
        tree = git.tree_with_file(repo_dir, candidate, extra[0], extra[1].encode(), scratch)
    sha = git.commit_tree(repo_dir, tree, [baseline], message, env=who)
    added = [c.paths[-1] for c in git.diff_changes(repo_dir, candidate, sha) if c.status in ("A", "C")]
    changed = len(git.diff_changes(repo_dir, candidate, sha))
    if added != ([extra[0]] if extra else []) or changed != len(added):
        raise AgentsearchError(
            f"the upstream commit {sha[:12]} differs from the judged tree by {added[:3]}; nothing was pushed"
        )
    return sha


def kernel_changes(repo_dir: Path, base: str, cand: str) -> list[tuple[str, str]]:
    """(op, provider) for each IR op whose first provider the change moved in ``serving.json``'s
    ``engine.ir_op_priority`` to a provider other than ``native``: the kernels it brings."""
    from harness.worker_protocol import SERVING_FILE
    from kernels import fork as kfork

    before = kfork.priorities(git.show_file(repo_dir, base, SERVING_FILE))
    after = kfork.priorities(git.show_file(repo_dir, cand, SERVING_FILE))
    return [
        (op, prio[0])
        for op, prio in sorted(after.items())
        if prio and prio[0] != "native" and before.get(op, [None])[0] != prio[0]
    ]


def kernel_benchmark(op: str, provider: str, profile: Profile, micro: str, version: str) -> tuple[str, str]:
    """(path, script): a standalone micro-benchmark of ``provider`` against ``native`` for ``op`` in the upstream's
    kernel benchmarks folder (``templates/kernel_bench.py.j2``; correctness first, then the median per call)."""
    import jinja2

    import templates as _templates
    from kernels.catalog import OPS

    if op not in OPS:
        raise AgentsearchError(f"no micro-benchmark for IR op {op!r}: agentsearch's kernel catalogue lacks it")
    info = OPS[op]
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,59}", provider):
        raise AgentsearchError(f"provider name {provider!r} of {op}: expected a Python identifier")
    path = f"{profile.kernel_benchmarks}benchmark_{op}_{provider}.py"
    tolerance = {d: (info.tolerance(d)["atol"], info.tolerance(d)["rtol"]) for d in info.dtypes}
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(Path(_templates.__file__).parent)), autoescape=False)
    summary = text.clean(micro or "not run", 400, one_line=True).replace("\\", "/").replace('"', "'")
    script = env.get_template("kernel_bench.py.j2").render(
        op=op,
        provider=provider,
        path=path,
        dtypes=repr(sorted(info.dtypes)),
        tolerance=repr(tolerance),
        micro=summary,
        version=version,
    )
    return path, script


def prompt_hash(meta: Mapping[str, Any]) -> str | None:
    """The agent's prompt hash as recorded (None: not recorded, or not an agent's proposal)."""
    h = meta.get("prompt_sha256")
    return h if isinstance(h, str) and re.fullmatch(r"[0-9a-f]{64}", h) else None


def branch_name(proposal: str) -> str:
    return BRANCH_PREFIX + re.sub(r"[^A-Za-z0-9._-]", "-", proposal)


# ---------------------------------------------------------------------------- shape-specific kernels
KERNEL_PATHS = ("vllm/kernels/", "vllm/ir/", "csrc/")
SHAPE_NAMES = frozenset(
    "m n k M N K batch batch_size bs num_tokens n_tokens tokens hidden hidden_size seq_len seqlen head_dim "
    "head_size num_heads n_rows n_cols rows cols".split()
)
DECLARED = "agentsearch: shape-specific"  # a comment on the line (or the one above) that declares it, with why
C_SHAPE = re.compile(
    r"\b(?:[MNK]|num_tokens|hidden_size|batch_size|head_dim|seq_len)\s*[!=]=\s*\d{2,}\b|\b\d{2,}\s*[!=]=\s*(?:[MNK]|num_tokens|hidden_size|batch_size|head_dim|seq_len)\b"
)


def shape_literals(repo_dir: Path, base: str, cand: str) -> list[str]:
    """``path:line: code`` for each added line of kernel code (``KERNEL_PATHS``) that compares a shape — a tensor's
    ``.shape``/``.size()``/``.numel()``, or a name like ``M``, ``num_tokens``, ``hidden_size`` — for equality with an
    integer literal (2 or more): a kernel hard-coded for the benchmark's shapes, which upstream cannot merge. Exempt:
    a provider's ``supports_args``/``supported`` (where a shape restriction belongs: other shapes go to ``native``),
    and a line declared with the comment ``# agentsearch: shape-specific <why>`` (on it or the line above)."""
    out: list[str] = []
    for path, lines in sorted(git.changed_lines(repo_dir, base, cand).items()):
        if not path.startswith(KERNEL_PATHS) or not lines:
            continue
        source = git.show_file(repo_dir, cand, path) or ""
        rows = source.splitlines()

        if path.endswith(".py"):
            for n in sorted(_python_shape_literals(source)):
                if n in lines and not _declared(rows, n):
                    out.append(f"{path}:{n}: {text.clean(rows[n - 1].strip(), 100, one_line=True)}")
        elif path.endswith((".cu", ".cuh", ".cpp", ".h", ".hpp", ".c")):
            for n in sorted(lines):
                if 1 <= n <= len(rows) and C_SHAPE.search(rows[n - 1]) and not _declared(rows, n):
                    out.append(f"{path}:{n}: {text.clean(rows[n - 1].strip(), 100, one_line=True)}")
    return out


def _declared(rows: Sequence[str], n: int) -> bool:
    """Line ``n`` (1-based) or the one above it carries the declaration comment."""
    return any(DECLARED in rows[i - 1] for i in (n, n - 1) if 1 <= i <= len(rows))


def _python_shape_literals(source: str) -> set[int]:
    """Lines of ``source`` with an exact shape comparison outside a provider's ``supports_args``/``supported``."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    found: set[int] = set()

    def shape(node: ast.AST) -> bool:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and sub.attr == "shape":
                return True
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and sub.func.attr in ("size", "numel"):
                return True
            if isinstance(sub, ast.Name) and sub.id in SHAPE_NAMES:
                return True
        return False

    def literal(node: ast.AST) -> bool:
        items = node.elts if isinstance(node, ast.Tuple | ast.List | ast.Set) else [node]
        return any(isinstance(i, ast.Constant) and type(i.value) is int and abs(i.value) >= 2 for i in items)

    def visit(node: ast.AST, exempt: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(("supports", "supported")):
            exempt = True
        if isinstance(node, ast.keyword) and node.arg in ("supports_args", "supported"):
            exempt = True
        if isinstance(node, ast.Compare) and not exempt:
            exact = all(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops)
            operands = [node.left, *node.comparators]
            if exact and any(shape(o) for o in operands) and any(literal(o) for o in operands):
                found.add(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, exempt)

    visit(tree, False)
    return found
