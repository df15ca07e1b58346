"""Reading the world: vLLM /metrics scraping, parsing and windowed observations.

``await scrape(url, timeout_s=, max_bytes=, session=, cache=)`` -> :class:`Snapshot` (``cache``: a
:class:`ParseCache` the caller keeps across scrapes);
``observe(prev, cur, between=())`` -> :class:`Observation` or :class:`NoObservation`;
``window_deltas(prev, cur, between=(), cache=)`` -> one pod's window deltas (``cache``: a
:class:`HistogramCache` the caller keeps across windows);
``observe_pool([(prev, cur), ...])`` -> :class:`PoolObservation`;
``to_status(obs)`` / ``from_status(dict)`` for the custom resource's status (camelCase).
"""

from kneecap.observe.histogram import HistogramCache
from kneecap.observe.observation import NoObservation, Observation, Reason
from kneecap.observe.pool import PoolObservation, from_status, observe_pool, to_status
from kneecap.observe.scrape import (
    ParseCache,
    ScrapeConnectionError,
    ScrapeError,
    ScrapeHTTPError,
    ScrapeTimeout,
    ScrapeTooLarge,
    Snapshot,
    parse_metrics,
    scrape,
)
from kneecap.observe.window import observe, window_deltas

__all__ = [
    "HistogramCache",
    "NoObservation",
    "Observation",
    "ParseCache",
    "PoolObservation",
    "Reason",
    "ScrapeConnectionError",
    "ScrapeError",
    "ScrapeHTTPError",
    "ScrapeTimeout",
    "ScrapeTooLarge",
    "Snapshot",
    "from_status",
    "observe",
    "observe_pool",
    "parse_metrics",
    "scrape",
    "to_status",
    "window_deltas",
]
