"""A tiny Llama-style model and byte-level BPE tokenizer, built offline and cached.

Random weights from a fixed seed (matrices N(0, 0.08), the output projection N(0, 0.4), RMSNorm
weights 1 + N(0, 0.1): next-token entropy about 3 nats, like a trained model's), a tokenizer
trained on local text (the installed vLLM's own Python sources — identical wherever the same vLLM
version is installed), saved in Hugging Face format. Nothing is downloaded.
The cache key covers every parameter, so a changed recipe builds a new directory.

    python -m harness.tiny_model DIR
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

RECIPE_VERSION = (
    2  # 2: RMSNorm weights 1 + N(0, 0.1), lm_head N(0, 0.4) (1: every parameter N(0, 0.08): flat, 9.70 of 9.70 nats)
)


@dataclass(frozen=True)
class TinySpec:
    vocab_size: int = 16384
    hidden_size: int = 128
    intermediate_size: int = 352
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    rms_norm_eps: float = 1e-5
    seed: int = 1234
    weight_std: float = 0.08  # every other matrix: N(0, weight_std), wider than the default
    lm_head_std: float = 0.4  # the output projection: logits of std ~4.5, next-token entropy like a trained model's
    norm_mean: float = 1.0  # RMSNorm weights: N(norm_mean, norm_std) — near 1 like a trained model, not exactly 1,
    norm_std: float = 0.1  # so that a reassociation in a norm kernel still moves a logprob by an ulp
    dtype: str = "float32"

    def key(self) -> str:
        blob = json.dumps({"recipe": RECIPE_VERSION, **asdict(self)}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]


def default_cache() -> Path:
    root = os.environ.get("AGENTSEARCH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "agentsearch"
    )
    return Path(root)


def training_text_files() -> list[Path]:
    """Local text for the tokenizer: vLLM's sources (sorted, so training is deterministic)."""
    spec = importlib.util.find_spec("vllm")
    files: list[Path] = []
    if spec and spec.submodule_search_locations:
        root = Path(list(spec.submodule_search_locations)[0])
        files = sorted(root.rglob("*.py"))
    if not files:
        raise RuntimeError("no local text to train the tokenizer on (vllm is not installed)")
    return files


def build(dest: Path, spec: TinySpec = TinySpec()) -> Path:
    """Build the model into ``dest`` (atomically: a temp dir renamed into place)."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    specials = ["<s>", "</s>", "<unk>", "<pad>"]
    bpe = ByteLevelBPETokenizer()
    bpe.train(
        [str(p) for p in training_text_files()],
        vocab_size=spec.vocab_size,
        min_frequency=2,
        special_tokens=specials,
        show_progress=False,
    )
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe._tokenizer,  # noqa: SLF001 - the tokenizers library's documented way to wrap it
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=spec.max_position_embeddings,
    )
    tok.save_pretrained(tmp)
    torch.manual_seed(spec.seed)
    cfg = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rms_norm_eps=spec.rms_norm_eps,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype=spec.dtype,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # in parameter order from one seed: deterministic
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.normal_(spec.norm_mean, spec.norm_std)
            elif name == "lm_head.weight":
                p.normal_(0.0, spec.lm_head_std)
            else:
                p.normal_(0.0, spec.weight_std)
    model.save_pretrained(tmp, safe_serialization=True)
    (tmp / "agentsearch-tiny.json").write_text(json.dumps({"recipe": RECIPE_VERSION, **asdict(spec)}, indent=1))
    if (dest / "agentsearch-tiny.json").exists():  # another process built it meanwhile: theirs may be in use
        shutil.rmtree(tmp, ignore_errors=True)
        return dest
    if dest.exists():
        shutil.rmtree(dest)  # a partial copy without its marker
    try:
        os.replace(tmp, dest)
    except OSError:
        if not (dest / "agentsearch-tiny.json").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def ensure(cache: Path | None = None, spec: TinySpec = TinySpec()) -> Path:
    """The cached tiny model directory, built on first use."""
    dest = (cache or default_cache()) / "models" / f"tiny-llama-{spec.key()}"
    if (dest / "agentsearch-tiny.json").exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{dest.name}.lock", "w") as lock:  # one build at a time (parallel tests, episodes)
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (dest / "agentsearch-tiny.json").exists():
            return dest
        return build(dest, spec)


def ensure_in_child(cache: Path | None = None, timeout_s: float = 1800, dest: Path | None = None) -> Path:
    """``ensure()`` (or ``build(dest)``) for callers that must not import torch: a child builds it."""
    import subprocess

    argv = [sys.executable, "-m", "harness.tiny_model"]
    if dest is not None:
        argv.append(str(dest))
    else:
        dest = (cache or default_cache()) / "models" / f"tiny-llama-{TinySpec().key()}"
        if (dest / "agentsearch-tiny.json").exists():
            return dest
    env = dict(os.environ)
    if cache is not None:
        env["AGENTSEARCH_CACHE"] = str(cache)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0 or not (dest / "agentsearch-tiny.json").exists():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"building the tiny model failed: {last}")
    return dest


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print("usage: python -m harness.tiny_model [DIR]", file=sys.stderr)
        return 2
    path = build(Path(argv[0]).resolve()) if argv else ensure()
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
