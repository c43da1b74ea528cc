"""Every seed the search uses, derived in one place.

An episode has one master seed (63 random bits unless ``--seed`` fixes it); each proposal's
evaluation gets its own master from it; each workload's pairs get their input seeds from that;
the confirmation run and the coverage trial use the same derivation under a different salt, so
their inputs are fresh. Seeds are one-way hashes: a pair seed does not reveal the evaluation's
master, and an evaluation's master does not reveal the episode's.
"""

from __future__ import annotations

import hashlib
import random
import secrets
from collections.abc import Callable

CONFIRMATION_SALT = 0x5EED  # the confirmation run: fresh inputs, same workloads
COVERAGE_SALT = 0xC0DE  # the untimed coverage trial
GUARD_CHECK_SALT = 0x6A4D  # a guard's regression re-measured on fresh engines
ADVISORY_SALT = 0xAD5E  # an agent's advisory measurement (its seeds also carry ADVISORY_BIT)

_BATCH_SALT = secrets.token_bytes(16)  # per orchestrator process: the same for both sides of a comparison


def new_master(bits: int = 63) -> int:
    """A fresh random master seed."""
    return secrets.randbits(bits)


def pair_seeds(master: int, workload: str) -> Callable[[int], int]:
    """Input seed of pair i of ``workload``: both sides of a pair share it; fresh per master seed."""

    def seed_of(i: int) -> int:
        h = hashlib.sha256(f"{master}:{workload}:{i}".encode()).digest()
        return int.from_bytes(h[:4], "big") & 0x7FFFFFFF

    return seed_of


ADVISORY_BIT = 1 << 31  # set in every advisory seed, in no gate seed (pair seeds are below 2**31)


def advisory_seeds(master: int, workload: str) -> Callable[[int], int]:
    """Input seeds of an agent's advisory measurement (``agentsearch.workbench``): from a range no gate
    seed is drawn from, so nothing the agent measured or tuned on is an input the gate will time."""
    inner = pair_seeds(master ^ ADVISORY_SALT, workload)
    return lambda i: ADVISORY_BIT | inner(i)


def confirmation_seeds(master: int, workload: str) -> Callable[[int], int]:
    """Pair seeds of the confirmation run (fresh inputs: none is a pair seed of the first run)."""
    return pair_seeds(master ^ CONFIRMATION_SALT, workload)


def guard_check_seeds(master: int, workload: str) -> Callable[[int], int]:
    """Pair seeds of a guard's regression re-measured on fresh engines (none is a pair seed of its first run)."""
    return pair_seeds(master ^ GUARD_CHECK_SALT, workload)


def coverage_seed(master: int, workload: str) -> int:
    """The input seed of the untimed, traced coverage trial."""
    return pair_seeds(master ^ COVERAGE_SALT, workload)(0)


def proposal_seed(master: int, number: int) -> int:
    """The evaluation master seed of proposal ``number`` of an episode with master seed ``master``."""
    h = hashlib.sha256(f"episode:{master}:{number}".encode()).digest()
    return int.from_bytes(h[:8], "big") & 0x7FFFFFFFFFFFFFFF  # 63 bits: not recoverable from the pair seeds


def proposal_rng(master: int, number: int) -> random.Random:
    """A proposer's random stream for proposal ``number`` (the sweep's bandit draws)."""
    return random.Random(f"{master}:{number}")


def batch_seed(seed: int, index: int) -> int:
    """The input seed of batch ``index`` of a latency round (unpredictable from the others)."""
    return int.from_bytes(hashlib.sha256(_BATCH_SALT + f"{seed}:{index}".encode()).digest()[:4], "big") & 0x7FFFFFFF
