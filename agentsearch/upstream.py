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

import math
import re
import sys
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
# a patch's From: as a co-author: letters (any script), spaces, . ' - and an address of plain characters
PLAIN_PERSON = re.compile(r"[^\W\d_](?:[\w .'-]{0,80}[\w.])? <[A-Za-z0-9._%+-]{1,64}@[A-Za-z0-9.-]{1,190}>")
SEARCH_TERMS = 5  # duplicate searches per pull request
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
        if PLAIN_PERSON.fullmatch(author):  # plain words and an address: no Markdown, no second person
            return author
    return TOOL_COAUTHOR.format(proposer=re.sub(r"[^a-z0-9-]", "-", proposer.lower())[:40])


def search_terms(title: str, files: Sequence[str]) -> list[str]:
    """At most ``SEARCH_TERMS`` terms for the duplicate search: first the names of the modules the change touches
    (what the diff says, not what the proposal says about itself: every changed file's stem, in the order of their
    paths), then the identifiers its title names (words with ``_`` or ``.``), then the title's longest words. Every
    term is a run of letters, digits, ``_``, ``.`` and ``-`` (a file named ``x is:closed.py`` gives ``x`` and
    ``closed``, never a qualifier): nothing a proposal writes leaves its term or becomes a search qualifier."""
    modules = []
    for f in files:
        stem = Path(f).name.split(".", 1)[0]
        if stem not in ("__init__", "setup", "serving", "agentsearch"):
            modules += [w for w in TERM_RE.findall(stem) if len(w) >= 3]
    words = TERM_RE.findall(text.clean(title, 300, one_line=True))
    named = [w for w in words if ("_" in w or "." in w) and len(w) >= 4]
    plain = sorted(
        (w for w in words if len(w) >= 5 and w.isalpha() and w.lower() not in STOP_WORDS), key=lambda w: -len(w)
    )
    terms: list[str] = []
    for w in [*modules, *named, *plain]:
        w = w.strip(".-")[:60]
        if w and TERM_RE.fullmatch(w) and w.lower() not in (t.lower() for t in terms):
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
    """Open pull requests matched, or no search could be derived from the change: the owner must say why this is not
    a duplicate (--not-duplicate)."""
    if not searches and not not_duplicate.strip():
        raise AgentsearchError(
            "no duplicate search could be derived from the change (no module name or identifier in it); search the "
            "open pull requests yourself and pass --not-duplicate 'what you searched and why this is not one of them'"
        )
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
KERNEL_MARKS = ("@triton.jit", "register_impl(", "torch.library.custom_op", "@torch.compile")  # kernel code elsewhere
C_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".h", ".hpp", ".c")
SHAPE_NAMES = frozenset(
    "m n k M N K batch batch_size bs num_tokens n_tokens tokens hidden hidden_size seq_len seqlen head_dim "
    "head_size num_heads n_rows n_cols rows cols".split()
)
SHAPE_CALLS = ("size", "numel", "stride")
DECLARED = "agentsearch: shape-specific"  # a comment on the line (or the one above) that declares it, with why
_C_NAME = (
    r"(?:[MNKmnk]|num_tokens|n_tokens|hidden_size|hidden|batch_size|batch|head_dim|head_size|seq_len|num_heads"
    r"|\w+\.size\(\s*-?\d\s*\))"
)
_C_NUM = r"(?:0[xX][0-9a-fA-F]+|\d{2,})[uUlL]*"
C_SHAPE = re.compile(rf"\b{_C_NAME}\s*[!=]=\s*{_C_NUM}\b|\b{_C_NUM}\s*[!=]=\s*{_C_NAME}|\bswitch\s*\(\s*{_C_NAME}\s*\)")
C_CHECKS = re.compile(r"\b(?:TORCH_CHECK|TORCH_INTERNAL_ASSERT|static_assert|assert)\s*\(")


def shape_literals(repo_dir: Path, base: str, cand: str) -> list[str]:
    """``path:line: code`` for each added line of kernel code that compares a shape with a literal: a kernel
    hard-coded for the benchmark's shapes, which upstream cannot merge.

    Kernel code: files under ``KERNEL_PATHS``, C/C++/CUDA sources, and any Python file that registers or defines a
    kernel (``KERNEL_MARKS``). A shape: a tensor's ``.shape``, ``.size()``, ``.numel()``, ``.stride()``, ``len()``,
    a name like ``M`` or ``num_tokens``, and any name assigned from one (``t = x.shape[0]``, a walrus, a tuple
    unpacking). A literal: an integer or integral float of 2 or more, a constant expression (``2**12``), a module
    constant (``H = 4096``), a tuple, list, set or ``range`` of them. Flagged: ``==``/``!=``/``in``/``not in``, a
    chained comparison pinning a shape between close literals, ``operator.eq``, ``not (s - 4096)``, a dict of
    literal keys looked up by a shape, a ``match`` on a shape with literal cases, and in C ``M == 4096``,
    ``x.size(-1) != 0x1000u``, ``switch (M)``. Exempt: a provider's ``supports_args``/``supported`` (exactly those
    names: where a restriction belongs, other shapes going to ``native``), C checks (``TORCH_CHECK``, ``assert``),
    comments, and a line declared with ``# agentsearch: shape-specific <why>`` (on it or the line above). A Python
    file this interpreter cannot parse is named as such (its lines cannot be checked)."""
    out: list[str] = []
    for path, lines in sorted(git.changed_lines(repo_dir, base, cand).items()):
        if not lines:
            continue
        source = git.show_file(repo_dir, cand, path) or ""
        rows = source.splitlines()
        if path.endswith(".py") and (path.startswith(KERNEL_PATHS) or any(m in source for m in KERNEL_MARKS)):
            found = _python_shape_literals(source)
            if found is None:
                out.append(f"{path}:1: cannot be parsed by Python {sys.version_info[0]}.{sys.version_info[1]}")
                continue
            for n in sorted(found):
                if n in lines and not _declared(rows, n):
                    out.append(f"{path}:{n}: {text.clean(rows[n - 1].strip(), 100, one_line=True)}")
        elif path.endswith(C_SUFFIXES):
            for n in sorted(lines):
                if not 1 <= n <= len(rows) or _declared(rows, n):
                    continue
                code = re.sub(r"//.*|/\*.*?\*/", "", rows[n - 1])
                if C_SHAPE.search(code) and not C_CHECKS.search(code):
                    out.append(f"{path}:{n}: {text.clean(rows[n - 1].strip(), 100, one_line=True)}")
    return out


def _declared(rows: Sequence[str], n: int) -> bool:
    """Line ``n`` (1-based) or the one above it carries the declaration comment."""
    return any(DECLARED in rows[i - 1] for i in (n, n - 1) if 1 <= i <= len(rows))


def _python_shape_literals(source: str) -> set[int] | None:
    """Lines of ``source`` that compare a shape with a literal outside a provider's ``supports_args``/``supported``
    (None: ``source`` does not parse)."""
    import ast

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return None
    consts: dict[str, float] = {}
    for stmt in tree.body:  # module constants: H = 4096
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
            v = _constant(stmt.value, {})
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                if isinstance(t, ast.Name) and v is not None:
                    consts[t.id] = v
    names = set(SHAPE_NAMES)

    def shape(node: ast.AST) -> bool:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len" and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Attribute) and arg.attr == "shape":
                return False  # len(x.shape) is the rank, not a shape
            return True
        if isinstance(node, ast.Attribute) and node.attr == "shape":
            return True
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SHAPE_CALLS:
            return True
        if isinstance(node, ast.Name) and node.id in names:
            return True
        return any(shape(child) for child in ast.iter_child_nodes(node))

    changed = True
    while changed:  # names assigned from shapes, to a fixpoint: t = x.shape[0]; (t := ...); b, h = x.shape
        changed = False
        for node in ast.walk(tree):
            value = getattr(node, "value", None)
            if not isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr) or value is None or not shape(value):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Name) and sub.id not in names:
                        names.add(sub.id)
                        changed = True

    def literal(node: ast.AST) -> bool:
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(literal(e) for e in node.elts)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
            return any(literal(a) for a in node.args)
        v = _constant(node, consts)
        return v is not None and abs(v) >= 2

    found: set[int] = set()

    def visit(node: ast.AST, exempt: bool) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name in ("supports_args", "supported"):
            exempt = True
        if isinstance(node, ast.keyword) and node.arg in ("supports_args", "supported"):
            exempt = True
        if not exempt:
            if _pins(node, shape, literal):
                found.add(getattr(node, "lineno", 0))
            if isinstance(node, ast.Match) and shape(node.subject):
                for case in node.cases:
                    if any(isinstance(p, ast.MatchValue) and literal(p.value) for p in ast.walk(case.pattern)):
                        found.add(case.pattern.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, exempt)

    visit(tree, False)
    found.discard(0)
    return found


def _pins(node: Any, shape: Any, literal: Any) -> bool:
    """``node`` compares a shape with a literal for equality (or pins it between close literals)."""
    import ast

    if isinstance(node, ast.Compare):
        operands = [node.left, *node.comparators]
        if all(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops):
            return any(shape(o) for o in operands) and any(literal(o) for o in operands)
        if len(operands) == 3 and shape(operands[1]) and literal(operands[0]) and literal(operands[2]):
            lo, hi = _constant(operands[0], {}), _constant(operands[2], {})
            return lo is not None and hi is not None and abs(hi - lo) <= 2
        return False
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute | ast.Name):
        fname = node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id
        if fname in ("eq", "ne", "__eq__", "__ne__", "isclose"):
            args = list(node.args) + ([node.func.value] if isinstance(node.func, ast.Attribute) else [])
            return any(shape(a) for a in args) and any(literal(a) for a in args)
        if fname == "get" and isinstance(node.func, ast.Attribute) and isinstance(node.func.value, ast.Dict):
            return any(k is not None and literal(k) for k in node.func.value.keys) and any(shape(a) for a in node.args)
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Dict):
        return any(k is not None and literal(k) for k in node.value.keys) and shape(node.slice)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and isinstance(node.operand, ast.BinOp):
        b = node.operand
        return isinstance(b.op, ast.Sub) and (shape(b.left) and literal(b.right) or shape(b.right) and literal(b.left))
    return False


def _constant(node: Any, consts: Mapping[str, float]) -> float | None:
    """The value of a constant integer expression (an integral float counts; ``2**12``, ``4 * 1024``, ``1 << 12``,
    a module constant), else None."""
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        v = float(node.value)
        return v if math.isfinite(v) and v == int(v) else None
    if isinstance(node, ast.Name):
        return consts.get(node.id)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        neg = _constant(node.operand, consts)
        return None if neg is None else -neg
    if isinstance(node, ast.BinOp):
        a, b = _constant(node.left, consts), _constant(node.right, consts)
        if a is None or b is None:
            return None
        try:
            if isinstance(node.op, ast.Pow) and abs(b) <= 64:
                return float(a**b)
            if isinstance(node.op, ast.Mult):
                return a * b
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            if isinstance(node.op, ast.LShift) and 0 <= b <= 64:
                return float(int(a) << int(b))
        except OverflowError:
            return None
    return None
