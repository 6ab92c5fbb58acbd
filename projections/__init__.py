"""Read models built from the domain events; each tracks its own position in the log."""

from projections.claimable import ClaimableQueue
from projections.counters import Counters
from projections.deliveries import Deliveries
from projections.delivery_ids import DeliveryIds
from projections.directory import Directory
from projections.fault_traces import FaultTraces
from projections.idempotency_keys import IdempotencyKeys
from projections.queue_load import QueueLoad
from projections.payload_holders import PayloadHolders
from projections.todo_rows import TodoRows


def all_projections():
    """Every projection, inline ones first."""
    return (ClaimableQueue(), QueueLoad(), TodoRows(), IdempotencyKeys(), Directory(), Deliveries(),
            Counters(), DeliveryIds(), FaultTraces(), PayloadHolders())
