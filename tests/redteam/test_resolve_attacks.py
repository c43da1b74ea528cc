"""Red team of the takes-effect check (#58): the step that runs each side's vLLM to resolve its engine configuration
before any engine starts (``agentsearch.takes_effect``, the worker's ``--resolve``).

What a proposal controls there: its ``serving.json`` (a change of that file alone is what the step resolves), so the
engine arguments and the ``VLLM_``/runtime variables the worker is given, and through them what vLLM's own code
reads, raises and prints. The worker runs main's code in the side's sandbox (the same ``sandbox.wrap`` as an engine),
the variables pass the serving whitelist (no ``PYTHONPATH``, ``LD_PRELOAD``), and the step can only reject: a lying
resolution would at most send the change to be measured as always. So the attacks left are the ones on what is shown
and on failing closed:

- a variable's *name* is the proposal's text (vLLM lists the ``VLLM_`` names it does not read, and the detail names
  them): escape sequences, Markdown and HTML in it must reach no terminal, report or PR body as markup;
- an engine argument vLLM refuses makes the candidate's resolution fail: a rejection of the candidate with one clean
  line (never the run's error, never a traceback, never a skip that lets it be measured);
- nothing of either run is left behind (no engine started, no worker alive).

It is also the suite's test that a knob vLLM ignores is rejected before any engine starts (moved here from
tests/test_vllm_integration.py), and that a kept baseline's resolving worker answers a candidate's serving.json as
the candidate's own worker does. Cost: one fork (about 12 s), one episode of four serving-only proposals, resolved
and never measured (about 10-20 s each cold, a few seconds warm, on the 2-core machine), and three resolutions.
"""

from __future__ import annotations

import json

import pytest

from agentsearch.workspace import Workspace
from history import HistoryLog
from history.proposals import proposals_of
from tests.conftest import commit, git, run_cli
from tests.test_vllm_integration import make_fork, workers_alive

pytestmark = pytest.mark.vllm

ESC = "\x1b"
# a VLLM_ name vLLM does not read, carrying an escape sequence, an HTML comment opener, a table cell and a heading
HOSTILE = "VLLM_X\x1b[2J<!--|## merged"


@pytest.fixture(scope="module")
def fork(tmp_path_factory):
    return make_fork(tmp_path_factory, "vllm-resolve")


def test_resolving_a_hostile_serving_file_rejects_it_cleanly_and_shows_nothing_as_markup(fork, tmp_path):
    from markdown_it import MarkdownIt

    base = json.loads(git(fork, "show", "main:serving.json"))
    env = base.get("env") or {}
    ignored = {**base, "env": {**env, "VLLM_NOT_A_SETTING": "1", HOSTILE: "</table><script>x</script>"}}
    commit(
        fork, {"serving.json": json.dumps(ignored, indent=2) + "\n"}, "a: variables vLLM does not read", branch="r/a"
    )
    git(fork, "checkout", "-q", "main")
    broken = {**base, "engine": {**(base.get("engine") or {}), "not_an_engine_argument": "\x1b[31m<!--"}}
    commit(fork, {"serving.json": json.dumps(broken, indent=2) + "\n"}, "b: an argument vLLM refuses", branch="r/b")
    git(fork, "checkout", "-q", "main")
    again = {**base, "env": {**env, "VLLM_ALSO_NOT_A_SETTING": "1"}}
    commit(fork, {"serving.json": json.dumps(again, indent=2) + "\n"}, "c: another one", branch="r/c")
    git(fork, "checkout", "-q", "main")
    quiet = {**base, "engine": {**(base.get("engine") or {}), "disable_log_stats": True}}  # in no config of vLLM's
    commit(fork, {"serving.json": json.dumps(quiet, indent=2) + "\n"}, "d: an argument of no effect", branch="r/d")
    git(fork, "checkout", "-q", "main")
    main = git(fork, "rev-parse", "main").strip()

    proc = run_cli("episode", "-C", str(fork), "--branches", "r/*", "--seed", "3", "--json", timeout=900)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert ESC not in proc.stderr, [ln for ln in proc.stderr.splitlines() if ESC in ln]  # progress names details
    out = json.loads(proc.stdout)
    by = {p["title"][:1]: p for p in out["proposals"]}
    assert set(by) == {"a", "b", "c", "d"} and git(fork, "rev-parse", "main").strip() == main  # nothing merged

    recorded = {
        p.created.title[:1]: p for p in proposals_of(HistoryLog(Workspace.open(fork).state / "history.jsonl").entries())
    }
    for key in ("a", "b", "c", "d"):  # each rejected by the resolve step, before any engine started
        v = recorded[key].verdict
        assert v.failed_check == "takes-effect" and v.timing.engine_starts == 0, (v.failed_check, v.timing)

    # the ignored variables: rejected as no effect, the names said (cleaned), nothing measured
    a = by["a"]
    assert a["verdict"] == "reject" and a["pairs"] is None, a
    why = " ".join(a["reasons"])
    assert "no effect: both sides resolve to the same engine configuration" in why, why
    assert "env.VLLM_NOT_A_SETTING: default -> 1" in why and "vLLM does not read VLLM_NOT_A_SETTING" in why, why
    assert ESC not in why, why
    # the refused argument: the candidate's rejection, one line, from the candidate's own resolution (not a skip that
    # would measure it, not the run's error)
    b = by["b"]
    assert b["verdict"] == "reject" and b["pairs"] is None, b
    assert recorded["b"].verdict.failures == ("setup-error",), recorded["b"].verdict.failures
    why_b = " ".join(b["reasons"])
    assert "the candidate's engine configuration does not resolve" in why_b and "\n" not in why_b, why_b
    assert ESC not in why_b and "Traceback" not in why_b, why_b
    assert not workers_alive(fork)

    # every place a person reads the details: the terminal's history, the Markdown report, the PR body (rendered)
    hist = run_cli("history", "-C", str(fork))
    assert hist.returncode == 0 and ESC not in hist.stdout, repr(hist.stdout[-800:])
    # the first resolved both sides and kept the baseline's resolving worker; the second's refused argument ended that
    # worker (its own worker then refused it); the third and fourth: the baseline's resolution kept, the candidate's
    # file resolved by the baseline's worker started again beside the second's (its variables, its engine section)
    assert "kept from the previous" not in why
    for key in ("c", "d"):
        why_k = " ".join(by[key]["reasons"])
        assert "no effect" in why_k and "the baseline's resolution kept from the previous decision" in why_k, why_k
        assert "the candidate resolved by the baseline's warm resolving worker" in why_k, why_k
    assert "disable_log_stats" in " ".join(by["d"]["reasons"])

    for p in (a, b):
        rep = run_cli("report", "-C", str(fork), p["proposal"])
        assert rep.returncode == 0, rep.stderr
        body = tmp_path / f"{p['title'][:1]}.md"
        pr = run_cli("pr", "-C", str(fork), p["proposal"], "--dry-run", "--force", "--no-plots", "-o", str(body))
        assert pr.returncode == 0, pr.stderr
        for text in (rep.stdout, body.read_text()):
            assert ESC not in text
            html = MarkdownIt("commonmark").enable("table").render(text)
            assert "<!--" not in html and "<script>" not in html and "</table><script>" not in html
            assert "<h2>merged" not in html  # the name's "## merged" is no heading
            assert "takes-effect" in html  # the check is shown, not hidden behind the name


# ============================================================================ the warm resolving worker
def _session(where, serving: dict):
    from harness import tiny_model
    from harness.engine_session import ResolveSession

    where.mkdir()
    (where / "serving.json").write_text(json.dumps(serving))
    spec = {"kind": "vllm-throughput", "model": str(tiny_model.ensure()), "engine": {"enforce_eager": True}}
    # the target's own [target.env], under each side's serving.json
    env = {"VLLM_CPU_KVCACHE_SPACE": "1"}
    return ResolveSession(spec, where, env, where / "resolve.log", "output_tok_s", 300.0, 300.0)


def test_a_warm_resolver_answers_another_serving_file_as_that_files_own_worker_does(tmp_path):
    """What a kept baseline's resolving worker answers for a candidate's serving.json (its engine section and its
    variables) is what the candidate's own worker answers cold, and a request leaves nothing behind for the next."""
    from agentsearch.takes_effect import differences
    from agentsearch.workloads import request_env

    base = {"engine": {"max_num_seqs": 4}, "env": {"VLLM_CPU_KVCACHE_SPACE": "2"}}
    cand = {"engine": {"max_num_seqs": 8}, "env": {"VLLM_NOT_A_SETTING": "1"}}
    warm, cold = _session(tmp_path / "b", base), _session(tmp_path / "c", cand)
    try:
        warm.start()
        cold.start()
        first, own = warm.resolved(), cold.resolved()
        # the candidate's file over the baseline's: its section, its variables, and a variable only the baseline's
        # file sets back to what the candidate's worker has (the target's value, not vLLM's default: red team)
        over = request_env(warm.env, base["env"], cand["env"])
        assert over == {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NOT_A_SETTING": "1"}
        got = warm.resolve_again(cand["engine"], over, 120.0)
        assert got["config"]["scheduler_config"]["max_num_seqs"] == 8
        assert differences(own["config"], got["config"]) == []

        # the variables as takes-effect compares them: those either side sets (vLLM draws some defaults per process)
        def set_by(*res):
            names = {n for r in res for n in r["set_env"]}
            return [{k: v for k, v in r["env"].items() if k in names} for r in res]

        assert got["set_env"] == own["set_env"] and got["unknown_env"] == own["unknown_env"] == ["VLLM_NOT_A_SETTING"]
        assert differences(*set_by(own, got)) == []
        assert (
            got["env"]["VLLM_CPU_KVCACHE_SPACE"]
            == own["env"]["VLLM_CPU_KVCACHE_SPACE"]
            != first["env"]["VLLM_CPU_KVCACHE_SPACE"]
        )
        # asked for the baseline's own file again: what it answered cold (nothing of the request stayed)
        again = warm.resolve_again(base["engine"], {}, 120.0)
        assert differences(first["config"], again["config"]) == [] and differences(*set_by(first, again)) == []
        assert again["unknown_env"] == first["unknown_env"] == [] and again["set_env"] == first["set_env"]
        # a section vLLM refuses ends the worker with the error, as it ends the candidate's own
        from harness.worker_protocol import WorkerError

        with pytest.raises(WorkerError, match="not_an_engine_argument"):
            warm.resolve_again({"not_an_engine_argument": 1}, {}, 120.0)
    finally:
        warm.close()
        cold.close()
    assert warm.proc is None and cold.proc is None
