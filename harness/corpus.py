"""The multilingual prompt corpus for distribution checks, and the per-workspace hidden holdout.

Prompts are composed deterministically from sentences written for this project
(``data/corpus_sentences.json``: 12 natural languages in Latin, Cyrillic, CJK, Hangul, Arabic
and Devanagari scripts, plus code and numbers): single sentences (short), pairs, and long
passages of many sentences (several hundred tokens). ``data/corpus.jsonl`` is the shipped
result; a test keeps it equal to ``build()``.

The holdout is chosen by a secret that lives only in the workspace's state directory:
``in_holdout(id)`` is an HMAC of the prompt id. Proposers never see the secret, so they cannot
know which prompts are held out; reports name only its size.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
from dataclasses import dataclass
from pathlib import Path

DATA = Path(__file__).with_name("data")
SENTENCES = DATA / "corpus_sentences.json"
CORPUS = DATA / "corpus.jsonl"
NATURAL = ("en", "de", "fr", "es", "pt", "ru", "zh", "ja", "ko", "ar", "hi", "tr")
JOINER = {"zh": "", "ja": "", "code": "\n", "numbers": "\n"}


@dataclass(frozen=True)
class Prompt:
    id: str
    lang: str
    text: str


def build(per_group: int = 24, seed: int = 20261129) -> list[Prompt]:
    """Compose the corpus: for every language, singles, pairs and long passages."""
    groups: dict[str, list[str]] = json.loads(SENTENCES.read_text())
    rng = random.Random(seed)
    out: list[Prompt] = []
    for lang in sorted(groups):
        sents = groups[lang]
        joiner = JOINER.get(lang, " ")
        texts: list[str] = list(sents[: per_group // 3])  # short: one sentence
        while len(texts) < 2 * per_group // 3:  # medium: two to four sentences
            texts.append(joiner.join(rng.sample(sents, rng.randint(2, 4))))
        while len(texts) < per_group:  # long: a passage of many sentences, some repeated
            budget = rng.randint(400, 900)  # UTF-8 bytes: several hundred tokens in any script
            parts: list[str] = []
            while len(joiner.join(parts).encode()) < budget:
                parts.append(rng.choice(sents))
            texts.append(joiner.join(parts))
        out += [Prompt(f"{lang}-{i:03d}", lang, t) for i, t in enumerate(texts)]
    return out


def write(path: Path = CORPUS) -> None:
    path.write_text(
        "".join(json.dumps({"id": p.id, "lang": p.lang, "text": p.text}, ensure_ascii=False) + "\n" for p in build())
    )


def load(path: Path | None = None) -> list[Prompt]:
    """Read a corpus JSONL (``{"id", "text"}`` and optionally ``"lang"`` per line)."""
    path = path or CORPUS
    prompts = []
    seen = set()
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            p = Prompt(str(d["id"]), str(d.get("lang", "unknown")), str(d["text"]))
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise ValueError(
                f"{path}:{n}: not a corpus line ({exc}); expected {{\"id\": ..., \"text\": ...}}"
            ) from None
        if p.id in seen:
            raise ValueError(f"{path}:{n}: duplicate prompt id {p.id!r}")
        seen.add(p.id)
        prompts.append(p)
    if not prompts:
        raise ValueError(f"{path}: no prompts")
    return prompts


def select(prompts: list[Prompt], size: int) -> list[Prompt]:
    """``size`` prompts (0 or more than there are: all of them) spread evenly over every language and,
    within a language, evenly over its prompts in corpus order (the shipped corpus runs short to long)."""
    if size <= 0 or size >= len(prompts):
        return list(prompts)
    by_lang: dict[str, list[Prompt]] = {}
    for p in prompts:
        by_lang.setdefault(p.lang, []).append(p)
    langs = sorted(by_lang)
    share = {lang: size // len(langs) + (1 if i < size % len(langs) else 0) for i, lang in enumerate(langs)}
    chosen: set[str] = set()
    for lang, group in by_lang.items():
        m = min(share[lang], len(group))
        if m == 1:
            chosen.add(group[len(group) // 2].id)
        elif m > 1:
            chosen.update(group[round(j * (len(group) - 1) / (m - 1))].id for j in range(m))
    return [p for p in prompts if p.id in chosen]


def in_holdout(secret: bytes, prompt_id: str, fraction: float) -> bool:
    digest = hmac.new(secret, prompt_id.encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def split(prompts: list[Prompt], secret: bytes, fraction: float) -> tuple[list[Prompt], list[Prompt]]:
    """(public, holdout) by the workspace's secret."""
    public: list[Prompt] = []
    hold: list[Prompt] = []
    for p in prompts:
        (hold if in_holdout(secret, p.id, fraction) else public).append(p)
    return public, hold


if __name__ == "__main__":
    write()
    print(f"wrote {len(build())} prompts to {CORPUS}")
