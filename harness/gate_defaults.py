"""The sequential design's defaults, in one place: ``harness.sequential.SequentialDesign`` and the
``[gate]`` config (``agentsearch.config.GateConfig``) both take them from here. No imports, so reading
a config (``history``, ``review``) never loads the statistics."""

MIN_EFFECT = 0.02  # smallest speedup worth merging
FUTILITY = 0.1  # type II level of the SPRT futility boundary
MIN_PAIRS = 3  # pairs before the first look
LOOK_EVERY = 1  # pairs between two looks
MAX_PAIRS = 20  # pairs per workload at most
# the interim win looks' share of a proposal's alpha (the last look gets the rest): 0.3 since 0.8, when the win looks
# became the first session's geometric looks and the session ends (6 on the starter) instead of every pair (27, at 0.2)
INTERIM_SHARE = 0.3
MAX_REGRESSION = 0.01  # a guard may not be significantly slower than this fraction
REGRESSION_ALPHA = 0.05  # level of the one-sided regression test
CALIBRATION_PAIRS = 30  # A/A pairs per workload of `agentsearch calibrate` (its --pairs default)
MACHINE_PROBE_S = (
    30.0  # `agentsearch calibrate --machine-probe`: seconds of the machine's own speed (harness.machine_noise)
)
REPLICATION_ALPHA = 0.01  # confirmation: fresh seeds measuring significantly less than the win -> not replicated
REPLICATION_SHARE = 0.5  # ...and only when the fresh pairs measure less than this share of the win (log scale)
LOADED_SHARE = 0.5  # an objective whose timed trials were more than this share under foreign load ...
LOADED_CONFIRM_ALPHA = 0.1  # ... must be confirmed significantly at this one-sided level, not only in direction
LOADED_CONFIRM_PAIRS = 4  # ... over at least this many fresh pairs: on 2 (t with 1 df) a real +67% win missed p < 0.1
# ... and on a CPU engine whose trials count their CPU time (a pinned cpuset), the CPU time per trial must have fallen
# by at least this share of the win (log scale): the same work in less wall time with no less CPU is a larger share
# of a CPU other processes contend for (two runnable processes get more of it than one), not a faster candidate
CPU_SHARE_OF_WIN = 0.5
# a guard's regression is measured again on fresh engines and seeds before it may reject: at least this many fresh
# pairs over this many fresh engine sessions, the between-session spread in the standard error. One session of 4
# pairs was one more pair of engine instances: on the engine (2026-12-06) one read a planted 8% regression as +15%;
# simulated with instances 3-5% apart (docs/2026-12-06-guard-aa-engine.md) it confirmed a real 10% regression in
# 22-70% of evaluations and let 10.7% of A/A guards reject where per-pair noise is low; 16 pairs over 4 sessions:
# 41-86%, A/A at most 3.2%
GUARD_CHECK_PAIRS = 16
GUARD_CHECK_SESSIONS = 4
