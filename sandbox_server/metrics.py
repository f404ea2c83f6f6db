"""Prometheus metrics of one server: the sandbox service's (:class:`Metrics`, an own registry per instance, so
several instances can coexist) and the env sessions' (:class:`EnvSessionCollector`, read from the session
store's :class:`~sandbox_server.session_census.Census` at each scrape; every server mode has them, field case
S63). ``/metrics`` (:mod:`sandbox_server.routes.health`) renders both.
"""

from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from sandbox_server.session_census import Census

_LAT = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
    """Pool gauges, latency histograms (seconds) and counters; :meth:`render` gives the text format."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.pool_idle = Gauge("forkyard_pool_idle", "idle warm sandboxes", registry=r)
        self.pool_busy = Gauge("forkyard_pool_busy", "sandboxes held by sessions", registry=r)
        self.pool_starting = Gauge("forkyard_pool_starting", "sandboxes being started", registry=r)
        self.pool_recycling = Gauge("forkyard_pool_recycling", "released sandboxes being reset for reuse", registry=r)
        self.sessions = Gauge("forkyard_sessions", "live sandbox sessions (those under env sessions included)",
                              registry=r)
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


class EnvSessionCollector:
    """The env sessions' metrics, read from ``census()`` at each scrape (no id, no kwargs in a label):

    * ``forkyard_env_sessions{env_id,transport}``: sessions held now (``transport``: ``rest`` or ``openenv``,
      the one that made the session; ``env_id``: the registered name);
    * ``forkyard_env_sessions_connection_held``: of those, the ones an open connection holds;
    * ``forkyard_env_sessions_in_use``, ``forkyard_env_sessions_max``: what counts against the cap, and the cap;
    * ``forkyard_env_sessions_expired_total{env_id,transport}``: sessions closed by the idle TTL;
    * ``forkyard_env_sessions_refused_total``: creates and forks refused at the cap.

    Args:
        census: returns the store's counts now (``EnvSessions.census``).
    """

    def __init__(self, census: Callable[[], Census]):
        self._census = census

    def collect(self) -> Iterator[Metric]:
        """The metric families now (prometheus-client's collector protocol)."""
        c = self._census()
        open_ = GaugeMetricFamily("forkyard_env_sessions", "env sessions held now, by env id and the transport "
                                  "that made them", labels=["env_id", "transport"])
        expired = CounterMetricFamily("forkyard_env_sessions_expired", "env sessions closed after their idle TTL",
                                      labels=["env_id", "transport"])
        for env_id, transport, n_open, n_expired in c.groups():
            if n_open:
                open_.add_metric([env_id, transport], n_open)
            if n_expired:
                expired.add_metric([env_id, transport], n_expired)
        yield open_
        yield GaugeMetricFamily("forkyard_env_sessions_connection_held",
                                "env sessions an open connection holds (never expired while it is open)",
                                value=c.connection_held)
        yield GaugeMetricFamily("forkyard_env_sessions_in_use", "envs counted against the env-session cap "
                                "(sessions, sessions being made, envs held outside sessions)", value=c.in_use)
        yield GaugeMetricFamily("forkyard_env_sessions_max", "the env-session cap", value=c.max_sessions)
        yield expired
        yield CounterMetricFamily("forkyard_env_sessions_refused", "env-session creates and forks refused at the cap",
                                  value=c.refused)

    def describe(self) -> list[Metric]:
        """No fixed description (the registry does not collect at registration)."""
        return []


def render_env_sessions(census: Callable[[], Census]) -> bytes:
    """The Prometheus text exposition of :class:`EnvSessionCollector` over ``census``."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EnvSessionCollector(census))
    return generate_latest(registry)
