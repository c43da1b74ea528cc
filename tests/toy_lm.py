"""A toy numpy language model implementing the logprob contract (copied into test targets).

python lm.py PROMPTS OUT
"""

import json
import sys

import numpy as np

V, D, K, STEPS = 96, 32, 8, 8
rng = np.random.default_rng(7)
E = rng.normal(0, 1, (V, D)).astype(np.float32)
W1 = rng.normal(0, 0.3, (D, D)).astype(np.float32)
W2 = rng.normal(0, 0.3, (D, D)).astype(np.float32)
U = rng.normal(0, 1, (D, V)).astype(np.float32)
EPS = np.float32(1e-5)


def tokenize(text):
    return [b % V for b in text.encode()][:48] or [0]


def rmsnorm(x):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)


def logits(tokens):
    h = np.cumsum(E[tokens], axis=0) / np.arange(1, len(tokens) + 1, dtype=np.float32)[:, None]
    h = h + np.tanh(rmsnorm(h) @ W1) @ W2
    return rmsnorm(h) @ U


def logprobs(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def top(lp):
    idx = np.argsort(-lp, kind="stable")[:K]
    return [[int(i), float(lp[i])] for i in idx]


def main(prompts_path, out_path):
    with open(prompts_path) as fh, open(out_path, "w") as out:
        for line in fh:
            item = json.loads(line)
            toks = tokenize(item["text"])
            lp = logprobs(logits(toks))
            pre = [None] + [top(lp[i - 1]) for i in range(1, len(toks))]
            out.write(json.dumps({"id": item["id"], "path": "prefill", "tokens": toks, "topk": pre}) + "\n")
            seq, gen, dec = list(toks), [], []
            for _ in range(STEPS):
                step = logprobs(logits(seq))[-1]
                t = int(np.argmax(step))
                dec.append(top(step))
                gen.append(t)
                seq.append(t)
            out.write(json.dumps({"id": item["id"], "path": "decode", "tokens": gen, "topk": dec}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
