"""Prometheus metrics of one service instance (own registry, so several instances can coexist)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LAT = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """Pool gauges, latency histograms (seconds) and counters; :meth:`render` gives the text format."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.pool_idle = Gauge("forkyard_pool_idle", "idle warm sandboxes", registry=r)
        self.pool_busy = Gauge("forkyard_pool_busy", "sandboxes held by sessions", registry=r)
        self.pool_starting = Gauge("forkyard_pool_starting", "sandboxes being started", registry=r)
        self.pool_recycling = Gauge("forkyard_pool_recycling", "released sandboxes being reset for reuse", registry=r)
        self.sessions = Gauge("forkyard_sessions", "live sessions", registry=r)
        self.snapshots = Gauge("forkyard_snapshots", "stored snapshots", registry=r)
        self.acquire_s = Histogram("forkyard_acquire_seconds", "time to acquire a sandbox", buckets=_LAT, registry=r)
        self.start_s = Histogram("forkyard_sandbox_start_seconds", "time to start a sandbox", buckets=_LAT, registry=r)
        self.exec_s = Histogram("forkyard_exec_seconds", "tool call latency in the service", ["tool"],
                                buckets=_LAT, registry=r)
        self.fork_s = Histogram("forkyard_fork_seconds", "clone / fork latency", ["op"], buckets=_LAT, registry=r)
        self.calls = Counter("forkyard_tool_calls", "tool calls by status", ["tool", "status"], registry=r)
        self.timeouts = Counter("forkyard_timeouts", "tool calls that ran past their deadline", registry=r)
        self.rejected = Counter("forkyard_rejected_calls", "tool calls refused before execution", registry=r)
        self.replaced = Counter("forkyard_sandboxes_replaced", "sandboxes replaced after their agent hung or died",
                                registry=r)
        self.recycle_s = Histogram("forkyard_recycle_seconds", "time to reset and verify a released sandbox",
                                   buckets=_LAT, registry=r)
        self.recycled = Counter("forkyard_sandboxes_recycled", "released sandboxes reset, verified and reused",
                                registry=r)
        self.recycle_failed = Counter("forkyard_recycle_failures",
                                      "released sandboxes destroyed because their reset could not be verified",
                                      registry=r)
        self.retired = Counter("forkyard_sandboxes_retired",
                               "released sandboxes destroyed because they reached max_sandbox_uses", registry=r)
        self.unavailable = Counter("forkyard_unavailable", "requests answered 503", ["reason"], registry=r)

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)
