"""A plan's MetricUpdates name their series by `Series` member: each member is a series of
OperatorMetrics of its kind, an update that does not fit the kind is refused where it is
built, and applying one changes exactly that series' sample."""

from __future__ import annotations

import pytest
from prometheus_client import Counter, Gauge

from kneecap.control.metric_series import Series
from kneecap.control.metrics import OperatorMetrics
from kneecap.control.tick import MetricUpdate


def test_every_series_is_an_operator_metric_of_its_kind_and_every_per_resource_metric_has_one():
    metrics = OperatorMetrics()
    for series in Series:
        metric = getattr(metrics, series.attribute)
        assert isinstance(metric, Gauge if series.kind == "gauge" else Counter), series
    declared = {name for name, value in vars(metrics).items() if isinstance(value, (Gauge, Counter))}
    assert declared == {series.attribute for series in Series}


@pytest.mark.parametrize("op, series", [("inc", Series.KNEE_BATCH), ("set", Series.DECISIONS), ("add", Series.REPLICAS)])
def test_an_update_that_does_not_fit_the_series_kind_is_refused_when_built(op, series):
    with pytest.raises(ValueError, match=series.name):
        MetricUpdate(op, series, ("ns", "llm", "server"), 1.0)


def test_applied_updates_set_increment_and_drop_the_named_series():
    metrics = OperatorMetrics()
    metrics.update(MetricUpdate("set", Series.KNEE_BATCH, ("ns", "llm", "server"), 96.0))
    metrics.update(MetricUpdate("inc", Series.DECISIONS, ("ns", "llm", "Applied"), 1.0))
    metrics.update(MetricUpdate("inc", Series.DECISIONS, ("ns", "llm", "Applied"), 1.0))
    sample = metrics.registry.get_sample_value
    assert sample("kneecap_knee_batch", {"namespace": "ns", "name": "llm", "pool": "server"}) == 96.0
    assert sample("kneecap_decisions_total", {"namespace": "ns", "name": "llm", "reason": "Applied"}) == 2.0
    metrics.update(MetricUpdate("drop", Series.KNEE_BATCH, ("ns", "llm", "server")))
    assert sample("kneecap_knee_batch", {"namespace": "ns", "name": "llm", "pool": "server"}) is None
    assert sample("kneecap_decisions_total", {"namespace": "ns", "name": "llm", "reason": "Applied"}) == 2.0
