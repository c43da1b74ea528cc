"""The machine's own speed noise (harness.machine_noise) and its place in a calibration."""

import json
import math
import os

import numpy as np
import pytest

from agentsearch.calibration import WorkloadNoise, load, with_machine_floor
from harness.machine_noise import ProbeError, ab_pairs, pair_floor, speed_series


def test_a_stable_machine_has_no_floor():
    chunks = [0.02] * 2000
    assert ab_pairs(chunks, 5, 8) == [0.0] * (2000 // 80)
    floor = pair_floor(chunks, 0.1, 8)
    assert floor is not None and floor.pair_sd == 0.0 and floor.speed_sd == 0.0 and floor.slices == 8
    assert math.isclose(floor.part_s, 0.1)


def test_alternation_cancels_a_slow_drift_and_independent_noise_averages():
    rng = np.random.default_rng(3)
    # a machine whose speed wanders slowly (a random walk of its log-speed) plus fast independent jitter
    walk = np.cumsum(rng.normal(0, 0.02, 40_000))
    chunks = list(0.02 * np.exp(walk + rng.normal(0, 0.02, walk.size)))
    whole = pair_floor(chunks, 0.8, 1)
    sliced = pair_floor(chunks, 0.1, 8)  # the same 0.8 s per side, in 8 alternating parts
    assert whole is not None and sliced is not None
    assert sliced.pair_sd < whole.pair_sd / 2  # A B B A ... tracks the wander a whole-trial pair cannot
    # independent noise alone: the SD of a pair is sqrt(2 / (slices x units per part)) times the unit's
    iid = list(0.02 * np.exp(rng.normal(0, 0.05, 40_000)))
    got = pair_floor(iid, 0.1, 8)
    assert got is not None
    assert got.pair_sd == pytest.approx(0.05 * math.sqrt(2 / 40), rel=0.2)
    assert got.pairs == 40_000 // 80


def test_overlapping_pairs_do_not_shrink_the_floor_of_a_short_series():
    """A series of a few pairs is replayed from every start it has; neighbours share parts, so the floor is taken
    around zero (an A/A's true mean), not around the pairs' own mean, which would underestimate it."""
    rng = np.random.default_rng(11)
    got = [
        pair_floor(list(0.02 * np.exp(rng.normal(0, 0.05, 240))), 0.1, 8).pair_sd for _ in range(300)
    ]  # 3 pairs each
    assert float(np.sqrt(np.mean(np.square(got)))) == pytest.approx(0.05 * math.sqrt(2 / 40), rel=0.1)


def test_a_series_too_short_for_three_pairs_gives_no_floor():
    assert pair_floor([0.02] * 100, 0.1, 8) is None  # one pair needs 80 units


def test_the_probe_runs_a_pinned_child_and_returns_its_units():
    cpu = min(os.sched_getaffinity(0))
    series = speed_series([cpu], 1.0)
    assert len(series) >= 10 and all(v > 0 for v in series)
    assert (
        0.001 < float(np.median(series)) < 0.2
    )  # sized to about 20 ms a unit (loosely: a loaded machine stretches it)
    with pytest.raises(ProbeError, match="failed"):
        speed_series([4096], 0.5)  # a CPU this machine does not have


def _noise(**kw):
    base = dict(
        workload="throughput",
        pairs=10,
        cv=0.03,
        sd_log_ratio=0.03,
        var=0.0009,
        df=9,
        drift_per_100=0.0,
        drift_p=0.5,
        outliers=0,
        order_effect=0.0,
        aa_speedup=1.0,
        aa_ci=(0.98, 1.02),
        pairs_needed=12,
    )
    return WorkloadNoise(**{**base, **kw})


def test_a_workload_gets_the_floor_of_its_own_alternation():
    rng = np.random.default_rng(5)
    chunks = list(0.02 * np.exp(rng.normal(0, 0.05, 4000)))
    sliced = with_machine_floor(_noise(trial_s=0.8, slices=8), chunks, frozenset({1}))
    whole = with_machine_floor(_noise(trial_s=0.8, slices=1), chunks, frozenset({1}))
    assert sliced.machine_floor_sd == pytest.approx(0.05 * math.sqrt(2 / 40), rel=0.3)
    assert (
        whole.machine_floor_sd is not None
        and sliced.machine_speed_sd is not None
        and sliced.machine_floor_pairs == 4000 // 80
    )
    assert (
        with_machine_floor(_noise(trial_s=None), chunks, None).machine_floor_sd is None
    )  # no trial length: nothing to replay
    assert (
        with_machine_floor(_noise(trial_s=30.0), chunks, None).machine_floor_sd is None
    )  # the series holds no three such pairs


def test_a_calibration_stored_before_the_probe_still_loads(tmp_path):
    (tmp_path / ".git" / "agentsearch").mkdir(parents=True)
    old = {
        "baseline": "b" * 40,
        "config_fingerprint": "c",
        "environment_fingerprint": "e",
        "created": 1.0,
        "schema_version": 1,
        "workloads": {
            "throughput": {k: v for k, v in _noise().__dict__.items() if not k.startswith("machine") and k != "slices"}
        },
    }
    old["workloads"]["throughput"]["aa_ci"] = list(old["workloads"]["throughput"]["aa_ci"])
    (tmp_path / ".git" / "agentsearch" / "calibration.json").write_text(json.dumps(old))

    class _Ws:  # load() reads only the state directory
        state = tmp_path / ".git" / "agentsearch"

    cal = load(_Ws())  # type: ignore[arg-type]
    assert cal is not None and cal.machine_probe == "" and cal.workloads["throughput"].machine_floor_sd is None
    assert cal.workloads["throughput"].slices == 1


def test_calibrate_probes_the_engines_cpus_for_warm_engine_workloads_only():
    from agentsearch.calibration import _machine_floors
    from agentsearch.config import load_config_text
    from agentsearch.workloads import engine_cpus, placement_for

    config = load_config_text(
        '[target.env]\nOMP_NUM_THREADS = "1"\n\n'
        '[[workload]]\nname = "throughput"\nkind = "vllm-throughput"\nmetric = "output_tok_s"\n\n'
        '[[workload]]\nname = "speed"\ncommand = "true"\nmetric = "v"\nhigher_is_better = true\n'
    )
    said = []
    results = {"throughput": _noise(trial_s=0.2, slices=2), "speed": _noise(workload="speed", trial_s=0.2)}
    got, probe = _machine_floors(config, results, 3.0, lambda s, d: said.append(d))
    assert got["throughput"].machine_floor_sd is not None and got["throughput"].machine_floor_pairs >= 3
    assert got["speed"].machine_floor_sd is None  # a command's trials run in fresh processes: not an engine's parts
    assert probe.startswith("3 s of a pure-CPU loop") and said and "probing" in said[0]
    cpus = engine_cpus(
        config, config.workload("throughput"), placement_for(config)
    )  # where the engines would be pinned
    assert (f"CPUs {','.join(map(str, sorted(cpus)))}" if cpus else "unpinned") in probe
    assert _machine_floors(config, results, 0.0, lambda s, d: None) == (results, "not probed")
    # trials too long for three pairs in the probe: no floor, and the note says how long a probe would do
    long = {"throughput": _noise(trial_s=10.0, slices=8)}
    got, probe = _machine_floors(config, long, 1.0, lambda s, d: None)
    assert (
        got["throughput"].machine_floor_sd is None and "too short for 3 pairs of throughput (10.0 s per side)" in probe
    )
    assert "--machine-probe 70" in probe
