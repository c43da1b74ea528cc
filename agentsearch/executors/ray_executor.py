"""The Ray executor: each evaluation runs whole on one node of a Ray cluster.

One evaluation = one placement group with one bundle (STRICT_PACK) over the CPUs and GPUs it
needs, pinned to the node chosen here (the ``ray.io/node-id`` label): both sides and every pair
on that node, never compared across machines. Ray's own retries are off (``max_retries=0``): a
task lost with its node comes back as a ``Fault`` and the orchestrator judges the proposal again
elsewhere with the same seeds; a node that keeps failing is drained (no more work this episode).

GPUs: Ray assigns each task the GPUs its bundle reserved and names them in CUDA_VISIBLE_DEVICES;
the node code sets that variable explicitly from ``ray.get_gpu_ids()`` (empty when the evaluation
reserved none), so the engines the harness starts see exactly the reserved devices, and it
removes RAY_ADDRESS from their environment so a vLLM engine never joins the cluster itself.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..errors import RunError
from .node import Job, NodeResult, run_job

Say = Callable[[str, str], None]
# an evaluation whose placement group gets no place on its node within this time (its resources taken by
# other work on the cluster) is a fault: judged again, on a node with room, instead of waiting forever
PLACE_TIMEOUT_S = 600.0


@dataclass
class Fault:
    """A task that never returned: its node (or worker process) died, or Ray lost it."""

    job: Job
    node_id: str
    error: str


@dataclass
class _Flight:
    job: Job
    node_id: str
    ref: Any
    pg: Any
    since: float = field(default_factory=time.monotonic)
    placed: bool = False  # its placement group got its place (the task can start)


def _remote_evaluate(job: Job, thin: bytes, full: list[Any], run_errors: tuple[type[BaseException], ...]) -> NodeResult:
    """The task body, on the node: devices made explicit, then the evaluation."""
    import ray

    gpus = tuple(str(g) for g in ray.get_gpu_ids())
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)  # no GPU reserved: none visible
    os.environ.pop("RAY_ADDRESS", None)
    node_id = ray.get_runtime_context().get_node_id()
    return run_job(job, thin, lambda: ray.get(full[0]), node_id, gpus, run_errors)


def _describe(exc: BaseException) -> str:
    """One line for a lost task: the node code's own exception when it raised one, else Ray's error."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        lines = str(cause).strip().splitlines()
        return f"{type(cause).__name__} on the node: {lines[-1] if lines else 'no detail'}"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else 'no detail'}"


def _reachable(address: str, timeout: float = 5.0) -> None:
    """A one-line RunError at once when ``host:port`` does not answer (``ray.init`` would retry for minutes)."""
    import socket

    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if address == "auto" or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout).close()
    except OSError as exc:
        raise RunError(
            f"cannot join the Ray cluster at {address!r}: {exc}; start it with `ray start --head` "
            "(see docs/guide/episodes.md, Several machines)"
        ) from None


class RayExecutor:
    kind = "ray"

    def __init__(
        self,
        address: str,
        parallel: int,
        cpus: float,
        gpus: float,
        drain_after: int,
        run_errors: tuple[type[BaseException], ...] = (),
        say: Say | None = None,
    ):
        import ray

        self.ray = ray
        self.parallel, self.cpus, self.gpus, self.drain_after = parallel, cpus, gpus, drain_after
        self.run_errors = run_errors
        self.say = say or (lambda stage, detail: None)
        _reachable(address)
        try:
            ray.init(address=address, namespace="agentsearch", log_to_driver=False, configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise RunError(f"cannot join the Ray cluster at {address!r}: {exc}") from None
        self._task = ray.remote(max_retries=0, retry_exceptions=False)(_remote_evaluate)
        self.flights: dict[int, _Flight] = {}
        self.failures: dict[str, int] = {}
        self.drained: set[str] = set()
        self._full: Any = None
        self._nodes: tuple[float, dict[str, dict[str, float]]] | None = None
        self.place_timeout_s = PLACE_TIMEOUT_S

    # ------------------------------------------------------------------ nodes
    def nodes(self) -> dict[str, dict[str, float]]:
        """Alive, undrained nodes -> their resources (asked of the cluster at most once a second)."""
        now = time.monotonic()
        if self._nodes is None or now - self._nodes[0] > 1.0:
            self._nodes = (now, {n["NodeID"]: n.get("Resources", {}) for n in self.ray.nodes() if n.get("Alive")})
        return {k: v for k, v in self._nodes[1].items() if k not in self.drained}

    def capacity(self) -> int:
        """Evaluations the cluster can run at once (within --parallel)."""
        return min(self.parallel, sum(self._slots(r) for r in self.nodes().values()))

    def _slots(self, res: dict[str, float]) -> int:
        n = int(res.get("CPU", 0) // self.cpus)
        if self.gpus > 0:
            n = min(n, int(res.get("GPU", 0) // self.gpus))
        return n

    def _pick(self, avoid: str | None) -> str | None:
        """The node with the most free slots (ours), not ``avoid`` unless no other has room."""
        busy: dict[str, int] = {}
        for f in self.flights.values():
            busy[f.node_id] = busy.get(f.node_id, 0) + 1
        free = [(self._slots(r) - busy.get(n, 0), n) for n, r in sorted(self.nodes().items())]
        free = [(k, n) for k, n in free if k > 0]
        if not free:
            return None
        others = [x for x in free if x[1] != avoid] or free
        return max(others, key=lambda x: x[0])[1]

    def free(self) -> int:
        return max(0, self.capacity() - len(self.flights))

    # ------------------------------------------------------------------ work
    def set_full_bundle(self, data: bytes) -> None:
        self._full = self.ray.put(data)

    def submit(self, job: Job, thin: bytes, avoid: str | None = None) -> bool:
        """Start ``job`` on a node with room; False when none has room now (call again later)."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        node = self._pick(avoid)
        if node is None:
            return False
        bundle = {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus > 0 else {})}
        pg = placement_group(
            [bundle],
            strategy="STRICT_PACK",
            bundle_label_selector=[{"ray.io/node-id": node}],
            name=f"agentsearch-{job.proposal}-{job.attempt}",
        )
        ref = self._task.options(
            num_cpus=self.cpus,
            num_gpus=self.gpus,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0),
        ).remote(job, thin, [self._full], self.run_errors)
        self.flights[job.number] = _Flight(job, node, ref, pg)
        self.say(job.proposal, f"evaluating on node {node[:12]} (attempt {job.attempt})")
        return True

    def poll(self, timeout: float) -> list[NodeResult | Fault]:
        """Results and faults of finished tasks (waits up to ``timeout`` s for the first)."""
        if not self.flights:
            return []
        refs = {f.ref: n for n, f in self.flights.items()}
        ready, _ = self.ray.wait(list(refs), num_returns=1, timeout=timeout)
        out: list[NodeResult | Fault] = []
        ready, _ = self.ray.wait(list(refs), num_returns=len(refs), timeout=0) if ready else (ready, None)
        for ref in ready:
            f = self.flights.pop(refs[ref])
            self._release(f)
            try:
                out.append(self.ray.get(ref))
            except self.ray.exceptions.RayError as exc:
                out.append(self._fault(f, _describe(exc)))
        self._nodes = None
        alive = set(self.nodes()) | self.drained
        for n, f in list(self.flights.items()):  # a placement group waiting for a node that died never starts
            why = "its node left the cluster" if f.node_id not in alive else self._unplaced(f)
            if why:
                self.flights.pop(n)
                self.ray.cancel(f.ref, force=True)
                self._release(f)
                out.append(self._fault(f, why))
        return out

    def _unplaced(self, f: _Flight) -> str:
        """'' while ``f`` has its place or may still get it; why not, once it waited ``place_timeout_s``."""
        if f.placed:
            return ""
        try:
            f.placed = bool(f.pg.wait(timeout_seconds=0))
        except Exception:  # noqa: BLE001 - Ray's own error: treated as not placed yet
            f.placed = False
        waited = time.monotonic() - f.since
        if f.placed or waited < self.place_timeout_s:
            return ""
        return (
            f"its placement group got no place on node {f.node_id[:12]} in {waited:.0f} s (the node's resources are "
            "taken)"
        )

    def _fault(self, f: _Flight, error: str) -> Fault:
        self.failures[f.node_id] = self.failures.get(f.node_id, 0) + 1
        if self.failures[f.node_id] >= self.drain_after and f.node_id not in self.drained:
            self.drained.add(f.node_id)
            self.say("executor", f"node {f.node_id[:12]} drained after {self.failures[f.node_id]} failed evaluations")
        return Fault(f.job, f.node_id, error)

    def _release(self, f: _Flight) -> None:
        from ray.util.placement_group import remove_placement_group

        try:
            remove_placement_group(f.pg)
        except Exception:  # noqa: BLE001 - already gone with its node
            pass

    def close(self) -> None:
        for f in self.flights.values():
            self.ray.cancel(f.ref, force=True)
            self._release(f)
        self.flights.clear()
        self.ray.shutdown()
