"""The review bot on the embedded default: `agentsearch review-pr` on pull requests to the real vLLM fork (CPU
build, the tiny model built offline), served by the loopback forge (benchmarks/fakeforge.py) from a bare remote.

Four pull requests, each judged by the real gate with real engines: the known win (serving.json max_num_seqs
4 -> 32), an A/A change (serving.json rewritten with the same settings), a change to a protected path
(bench/), and the win judged again (the same comment must be edited). Prints one row per review: the status
posted, the verdict line, the seconds it took, the comment's id; and whether each acceptance holds.

    python benchmarks/forge_review.py [--work DIR] [--json OUT]     (about 20-30 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.fakeforge import FakeForge  # noqa: E402


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-c", "commit.gpgsign=false", "-c", "user.name=bench", "-c", "user.email=bench@example.invalid", *args],
        cwd=repo,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def cli(*args: str, timeout: float = 5400) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentsearch.cli", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def branch(fork: Path, name: str, files: dict[str, str], msg: str) -> None:
    git(fork, "checkout", "-q", "-b", name, "main")
    for rel, text in files.items():
        p = fork / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    git(fork, "add", "-A")
    git(fork, "commit", "-q", "-m", msg)
    git(fork, "checkout", "-q", "main")
    git(fork, "push", "-q", "origin", f"{name}:{name}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, help="Where the fork, the remote and the state go (default: a new temp dir).")
    ap.add_argument("--json", type=Path, help="Also write the rows as JSON there.")
    a = ap.parse_args()
    work = a.work or Path(tempfile.mkdtemp(prefix="forge-review-"))
    work.mkdir(parents=True, exist_ok=True)
    fork, bare = work / "fork", work / "remote.git"
    t0 = time.perf_counter()
    if not (fork / ".git").exists():
        made = cli("init", "--from-installed", "vllm", str(fork))
        if made.returncode != 0:
            sys.exit(f"init failed: {made.stderr[-500:]}")
    model = cli("model", "tiny")
    if model.returncode != 0:
        sys.exit(f"model failed: {model.stderr[-500:]}")
    print(f"fork {fork} ready in {time.perf_counter() - t0:.0f} s", flush=True)
    fake = FakeForge(bare).start()
    try:
        toml = (fork / "agentsearch.toml").read_text()
        (fork / "agentsearch.toml").write_text(
            toml + f'\n[forge]\nkind = "github"\nurl = "{fake.url}"\nrepo = "acme/fork"\n'
        )
        git(fork, "commit", "-q", "-am", "agentsearch: judge pull requests on the loopback forge")
        subprocess.run(["git", "clone", "-q", "--bare", str(fork), str(bare)], check=True)
        git(fork, "remote", "add", "origin", str(bare))
        os.environ["AGENTSEARCH_FORGE_TOKEN"] = fake.token
        serving = json.loads((fork / "serving.json").read_text())
        win = json.loads(json.dumps(serving))
        win["engine"]["max_num_seqs"] = 32
        branch(fork, "more-seqs", {"serving.json": json.dumps(win, indent=2) + "\n"}, "max_num_seqs 4 -> 32")
        branch(
            fork,
            "same",
            {"serving.json": json.dumps(serving, indent=4, sort_keys=True) + "\n"},
            "serving.json reformatted",
        )
        branch(fork, "bench-edit", {"bench/NOTES.md": "faster, trust me\n"}, "A note in bench/")
        prs = {"win": fake.open_pr("more-seqs"), "aa": fake.open_pr("same"), "protected": fake.open_pr("bench-edit")}
        rows = []
        for label, number in [*prs.items(), ("win again", prs["win"])]:
            t = time.perf_counter()
            proc = cli("review-pr", str(number), "-C", str(fork), "--json")
            secs = time.perf_counter() - t
            try:
                got = json.loads(proc.stdout)
            except ValueError:
                got = {
                    "outcome": "—",
                    "headline": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "no output",
                }
            head = fake.prs[number]["head"]["sha"]
            status = fake.status(head) or {}
            comments = fake.ours(number)
            rows.append(
                {
                    "pr": label,
                    "number": number,
                    "outcome": got.get("outcome"),
                    "status": status.get("state"),
                    "headline": got.get("headline"),
                    "seconds": round(secs),
                    "comments": [c["id"] for c in comments],
                    "names_path": "bench/NOTES.md" in (comments[-1]["body"] if comments else ""),
                }
            )
            r = rows[-1]
            print(
                f"{label:10} #{number} status={r['status']} outcome={r['outcome']} {r['seconds']} s "
                f"comments={r['comments']}\n"
                f"           {r['headline']}",
                flush=True,
            )
        checks = {
            "win posts success": rows[0]["status"] == "success",
            "A/A never success": rows[1]["status"] in ("pending", "failure"),
            "protected path fails naming it": rows[2]["status"] == "failure" and rows[2]["names_path"],
            "re-run edits the same comment": len(rows[3]["comments"]) == 1
            and rows[3]["comments"] == rows[0]["comments"],
        }
        for k, ok in checks.items():
            print(f"{'holds' if ok else 'FAILS'}: {k}")
        print(f"total {time.perf_counter() - t0:.0f} s")
        if a.json:
            a.json.write_text(json.dumps({"rows": rows, "checks": checks}, indent=2))
        return 0 if all(checks.values()) else 1
    finally:
        fake.stop()


if __name__ == "__main__":
    sys.exit(main())
