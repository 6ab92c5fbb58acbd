"""`GET /metrics` (CONTRACT §10): Prometheus text format behind a bearer token.

Every value comes from the read models at scrape time (caught up first), so a scrape includes
what other processes wrote. Labels are bounded: queue, state, source, outcome, verdict,
projection and version — never a todo or an endpoint.

- `switchboard_queue_todos{queue,state}`: state is `pending`, `claimed`, `done` or `failed` (the
  states of CONTRACT §6; dead letters are failed); every state of every queue that holds a todo.
- `switchboard_queue_dead_letters{queue}` (beyond §10): how many of the failed are dead letters,
  the number an operator alerts on.
- `switchboard_queue_oldest_pending_seconds{queue}`: now minus the creation time of the queue's
  oldest pending todo; 0 when none is pending.
- `switchboard_todos_created_total{queue,source}`, `switchboard_todos_claimed_total{queue}`,
  `switchboard_todos_completed_total{queue,outcome}` (`complete`, `fail`),
  `switchboard_leases_expired_total{queue}`, `switchboard_webhook_deliveries_total{source,verdict}`
  (`routed`, `duplicate`, `dropped`, `faulted`): see projections/counters.py.
- `switchboard_queue_in_flight{queue}`: the queue's claimed todos (CONTRACT §13), every queue that
  has a todo or a claim.
- `switchboard_claims_refused_total{queue,reason}`: claims the queue's controls refused (`paused`,
  `max_in_flight`, `rate_limited`), counted by every process in one table.
- `switchboard_projection_lag_events{projection}`: the log's last position minus the
  projection's tracked position, measured before the scrape catches the projections up.
- `switchboard_audit_sealed_position`: the last log position sealed into the hash chain
  (docs/audit.md); `switchboard_audit_unsealed_events`: events appended after it (near 0: every
  event is sealed within a second).
- `switchboard_build_info{version}`: always 1.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterator

from litestar import MediaType, Request, Response, get
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from prometheus_client.registry import CollectorRegistry

from application.audit import AuditLog
from application.ports import Clock
from interfaces.bootstrap import Container
from interfaces.store.metrics import QUEUE_STATES, SqlMetrics
from interfaces.version import VERSION
from projections.base import micros
from projections.counters import CLAIMED, COMPLETED, CREATED, DELIVERIES, EXPIRED

# metric of projections/counters.py -> (series name without `_total`, help, label names)
COUNTERS = (
    (CREATED, "switchboard_todos_created", "Todos opened.", ("queue", "source")),
    (CLAIMED, "switchboard_todos_claimed", "Claims (attempts) taken.", ("queue",)),
    (COMPLETED, "switchboard_todos_completed", "Attempts ended by complete or fail.", ("queue", "outcome")),
    (EXPIRED, "switchboard_leases_expired", "Leases that lapsed.", ("queue",)),
    (DELIVERIES, "switchboard_webhook_deliveries", "Accepted webhook deliveries.", ("source", "verdict")),
)


class SwitchboardCollector:
    """Builds every series from one read of the read models, at scrape time."""

    def __init__(self, metrics: SqlMetrics, clock: Clock, audit: AuditLog | None = None) -> None:
        self.metrics = metrics
        self.clock = clock
        self.audit = audit

    def collect(self) -> Iterator[Metric]:
        snapshot = self.metrics.read()
        now = micros(self.clock.now())
        todos = GaugeMetricFamily("switchboard_queue_todos", "Todos per queue and state.", labels=("queue", "state"))
        oldest = GaugeMetricFamily(
            "switchboard_queue_oldest_pending_seconds", "Age of the oldest pending todo per queue (0 if none).",
            labels=("queue",),
        )
        dead = GaugeMetricFamily(
            "switchboard_queue_dead_letters", "Dead letters per queue (failed todos with no retry left).",
            labels=("queue",),
        )
        for queue in snapshot.queues:
            for state in QUEUE_STATES:
                todos.add_metric((queue, state), snapshot.todos.get((queue, state), 0))
            dead.add_metric((queue,), snapshot.dead_letters.get(queue, 0))
            created_at = snapshot.oldest_pending.get(queue)
            oldest.add_metric((queue,), 0.0 if created_at is None else max(now - created_at, 0) / 1_000_000)
        in_flight = GaugeMetricFamily("switchboard_queue_in_flight", "Claimed todos per queue.", labels=("queue",))
        for queue in sorted(set(snapshot.queues) | set(snapshot.in_flight)):
            in_flight.add_metric((queue,), snapshot.in_flight.get(queue, 0))
        refused = CounterMetricFamily(
            "switchboard_claims_refused", "Claims refused by the queue's controls.", labels=("queue", "reason"),
        )
        for (queue, reason), total in sorted(snapshot.refused.items()):
            refused.add_metric((queue, reason), total)
        yield todos
        yield dead
        yield oldest
        yield in_flight
        yield refused
        for metric, name, documentation, labels in COUNTERS:
            family = CounterMetricFamily(name, documentation, labels=labels)
            for (a, b), total in sorted(snapshot.counters.get(metric, {}).items()):
                family.add_metric((a, b)[: len(labels)], total)
            yield family
        lag = GaugeMetricFamily(
            "switchboard_projection_lag_events", "Events appended but not yet applied, per projection.",
            labels=("projection",),
        )
        for projection, behind in sorted(snapshot.lag.items()):
            lag.add_metric((projection,), behind)
        yield lag
        if self.audit is not None:
            head, unsealed = self.audit.head(), self.audit.unsealed()
            yield GaugeMetricFamily("switchboard_audit_sealed_position",
                                    "The last log position sealed into the audit hash chain.", value=head["position"])
            yield GaugeMetricFamily("switchboard_audit_unsealed_events",
                                    "Events appended after the last sealed position.", value=unsealed)
        build = GaugeMetricFamily("switchboard_build_info", "The running version.", labels=("version",))
        build.add_metric((VERSION,), 1)
        yield build


def bearer_matches(header: str | None, token: str | None) -> bool:
    """`Authorization: Bearer <token>` with the configured token, compared in constant time."""
    if not token or header is None:
        return False
    scheme, _, credential = header.strip().partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(credential.strip().encode(), token.encode())


def metrics_route(container: Container):
    """The `/metrics` handler over a private registry (nothing global, nothing at import)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SwitchboardCollector(SqlMetrics(container.store.db, container.projector), container.clock,
                                           container.audit))
    token = container.settings.metrics_token

    @get("/metrics", include_in_schema=False, sync_to_thread=True)
    def metrics(request: Request) -> Response:
        if not bearer_matches(request.headers.get("authorization"), token):
            # the contract's exception to the JSON error body: 401 with an empty body
            return Response(b"", status_code=401, media_type=MediaType.TEXT,
                            headers={"WWW-Authenticate": 'Bearer realm="switchboard"'})
        # the classic text format generate_latest writes, named as every Prometheus version knows it
        return Response(generate_latest(registry), headers={"content-type": CONTENT_TYPE_PLAIN_0_0_4})

    return metrics
