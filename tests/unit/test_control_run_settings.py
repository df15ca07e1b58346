"""kopf settings of `kneecap run`: which scopes scan namespaces, and how soon a deleted resource's
finalizer is checked again after its tick."""

from __future__ import annotations

import pytest

from kneecap.control.handlers import TIMER_EXIT_POLL_S, operator_settings


@pytest.mark.parametrize("namespaces, clusterwide, scans", [
    (["serving"], False, False),                 # exact names: nothing to match, no namespace read
    (["serving", "team-a"], False, False),
    (["team-*"], False, True),                   # a glob: kopf lists namespaces to match it
    (["serving", "!kube-system"], False, True),  # a negation is a pattern too
    (["Serving"], False, True),                  # not an RFC 1123 label: left to kopf as given
    ([], True, True),                            # cluster-wide: kopf discovers CRDs as they come
])
def test_namespace_scan_only_where_a_pattern_needs_it(namespaces, clusterwide, scans):
    settings = operator_settings(namespaces, clusterwide=clusterwide)
    assert settings.scanning.disabled is (not scans)


def test_deletion_rechecks_the_timer_within_seconds():
    settings = operator_settings(["serving"])
    assert settings.background.cancellation_polling == TIMER_EXIT_POLL_S <= 5.0
    # the default is a minute: a deletion would hold its finalizer that long after a busy tick
    import kopf
    assert kopf.OperatorSettings().background.cancellation_polling == 60


def test_fleet_flags_reach_the_operator_config():
    """`kneecap run --fleet-inventory/--fleet-interval`: the inventory parsed as `kneecap pack
    --gpus` (prices: the flag's, else the catalog's), the interval in seconds; without them
    today's GPU types and 60 s."""
    import argparse

    from kneecap.commands import run as run_cmd

    parser = argparse.ArgumentParser()
    run_cmd.add_arguments(parser)
    args = parser.parse_args(["--fleet-inventory", "h100-80gb=12,l40s=4", "--fleet-inventory", "l4=8@0.5",
                              "--fleet-interval", "15"])
    run_cmd._check(args)
    inv = run_cmd.fleet_inventory(args)
    assert [(o.gpu.key, o.count, o.cost_per_hour) for o in inv] == [("h100-80gb", 12, 5.0), ("l40s", 4, 1.8),
                                                                      ("l4", 8, 0.5)]
    assert args.fleet_interval == 15.0
    default = parser.parse_args([])
    run_cmd._check(default)
    assert run_cmd.fleet_inventory(default) is None and default.fleet_interval == 60.0
