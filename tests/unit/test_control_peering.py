"""kopf peering priorities (handlers.oldest_first_priority): the earliest-started replica leads.
Two replicas on the real API: tests/kube/test_peering.py and test_leader_restart.py."""

from kneecap.control.handlers import oldest_first_priority


def test_oldest_first_priority_orders_replicas_by_start_time():
    a, b = oldest_first_priority(1000.0), oldest_first_priority(1000.002)
    assert a > b  # started 2 ms earlier: leads
    assert len({oldest_first_priority(1000.0) for _ in range(50)}) > 1  # a tie-break at the same ms
