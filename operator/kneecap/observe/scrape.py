"""Scrape and parse a vLLM ``/metrics`` page into a timestamped :class:`Snapshot`.

Parsing is tolerant: a line that prometheus-client cannot parse, or whose value is NaN or
infinite, is dropped and its metric name recorded in ``Snapshot.invalid``; a body whose last
line is cut off (no trailing newline) is marked ``truncated`` and its last metric family is
dropped whole, because a family cut mid-way would yield wrong sums. Deciding whether what is
left is enough is the window's job (:mod:`kneecap.observe.window`), which answers with a typed
``NoObservation`` rather than a wrong number.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

try:  # prometheus-client's own sample and value parsers (private; present since 0.17)
    from prometheus_client.parser import _parse_sample, _parse_value_and_timestamp
except ImportError:  # pragma: no cover - a prometheus-client without them parses whole families
    _parse_sample = _parse_value_and_timestamp = None

Labels = tuple[tuple[str, str], ...]
"""Sorted (name, value) label pairs: a hashable series key."""

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MAX_BYTES = 8 * 1024 * 1024

_NAME_RE = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)")
_TYPE_RE = re.compile(r"^#\s*TYPE\s+([a-zA-Z_:][a-zA-Z0-9_:]*)\s")


class ScrapeError(Exception):
    """A scrape that produced no snapshot. ``url`` names the target, ``kind`` the failure."""

    kind = "error"

    def __init__(self, url: str, message: str):
        self.url = url
        super().__init__(f"scrape {url}: {message}")


class ScrapeTimeout(ScrapeError):
    kind = "timeout"


class ScrapeTooLarge(ScrapeError):
    kind = "too_large"


class ScrapeHTTPError(ScrapeError):
    kind = "http_status"

    def __init__(self, url: str, status: int):
        self.status = status
        super().__init__(url, f"HTTP {status}")


class ScrapeConnectionError(ScrapeError):
    kind = "connection"


@dataclass(frozen=True)
class Snapshot:
    """One parsed scrape.

    ``series`` maps a sample name (``vllm:prompt_tokens_total``, ``..._bucket``) to
    ``{labels: value}``; every value is finite. ``t_s`` is the wall-clock time (epoch seconds)
    the body was received.
    """

    url: str
    t_s: float
    series: Mapping[str, Mapping[Labels, float]]
    truncated: bool = False
    dropped_family: str | None = None  # the family removed because the body was cut inside it
    invalid: frozenset[str] = frozenset()  # sample names dropped: NaN/inf value or garbage line
    size_bytes: int = 0

    def get(self, name: str) -> Mapping[Labels, float] | None:
        return self.series.get(name)

    def value(self, name: str) -> float | None:
        """Sum of all series of ``name`` (several ``engine`` label values add), or None."""
        s = self.series.get(name)
        return None if not s else math.fsum(s.values())

    @property
    def process_start_s(self) -> float | None:
        return self.value("process_start_time_seconds")


_SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created", "_gcount", "_gsum", "_info")


def _family_of(sample_name: str, family_names: set[str]) -> str:
    for suffix in _SUFFIXES:
        if sample_name.endswith(suffix) and sample_name[: -len(suffix)] in family_names:
            return sample_name[: -len(suffix)]
    return sample_name


def _line_ok(line: str) -> bool:
    try:
        for _ in text_string_to_metric_families(line + "\n"):
            pass
        return True
    except Exception:  # prometheus-client raises ValueError, IndexError, ... on garbage
        return False


def family_filter(names) -> frozenset[str]:
    """The sample and family names to keep so that every name in ``names`` (sample names such as
    ``vllm:prompt_tokens_total`` or family names such as ``vllm:e2e_request_latency_seconds``)
    parses with its whole family: the base name with and without each sample suffix."""
    bases = set()
    for n in names:
        bases.add(n)
        for sfx in _SUFFIXES:
            if n.endswith(sfx):
                bases.add(n[: -len(sfx)])
    return frozenset(b + sfx for b in bases for sfx in ("", *_SUFFIXES))


def _line_name(line: str) -> str | None:
    """Metric name of a sample line, or of a ``# TYPE``/``# HELP`` line; None for other comments
    and blank lines."""
    if line.startswith("#"):
        parts = line.split(None, 3)
        return parts[2] if len(parts) >= 3 and parts[1] in ("TYPE", "HELP") else None
    end = len(line)
    for ch in "{ \t":
        i = line.find(ch)
        if 0 <= i < end:
            end = i
    return line[:end].strip() or None


def _last_family(lines: list[str]) -> str | None:
    """The family the last named line (sample or TYPE) belongs to: where a cut body was cut."""
    declared: set[str] | None = None
    for line in reversed(lines):
        m = _TYPE_RE.match(line) or (None if line.startswith("#") else _NAME_RE.match(line))
        if m:
            if declared is None:
                declared = {t.group(1) for ln in lines if ln.startswith("#") and (t := _TYPE_RE.match(ln))}
            return _family_of(m.group(1), declared)
    return None


def parse_metrics(text: str, *, url: str = "", t_s: float | None = None,
                  keep: frozenset[str] | None = None) -> Snapshot:
    """Parse a Prometheus text exposition into a :class:`Snapshot` (tolerant, see module doc).

    ``keep`` (from :func:`family_filter`): keep only the series of those names (a smaller
    snapshot; a known series not kept costs one dict lookup); the rest of the body is skipped
    and its garbage not recorded in ``invalid``. The truncation rule still applies to the whole
    body: a kept family is dropped only if the cut fell inside it."""
    t_s = time.time() if t_s is None else t_s
    size = len(text.encode("utf-8", "replace"))
    truncated = bool(text) and not text.endswith("\n")
    lines = text.split("\n")
    if truncated:
        lines = lines[:-1]  # the partial last line
    elif lines and lines[-1] == "":
        lines = lines[:-1]
    # The family the cut fell in: the last one named by a sample or TYPE line (of the whole
    # body when filtered: a cut in a family not kept drops nothing kept).
    dropped_family = _last_family(lines) if truncated else None
    if keep is not None and _parse_sample is None:
        lines = [ln for ln in lines if _line_name(ln) in keep]
    invalid: set[str] = set()
    series: dict[str, dict[Labels, float]] = {}
    for name, key, value in (_samples_cached(lines, keep) if _parse_sample is not None else _samples_full(lines)):
        if value is None:
            invalid.add(name)
            continue
        if dropped_family is not None and _family_of(name, {dropped_family}) == dropped_family:
            continue
        if not math.isfinite(value):
            invalid.add(name)
            continue
        series.setdefault(name, {})[key] = value
    frozen = MappingProxyType({k: MappingProxyType(v) for k, v in series.items()})
    return Snapshot(
        url=url,
        t_s=t_s,
        series=frozen,
        truncated=truncated,
        dropped_family=dropped_family,
        invalid=frozenset(invalid),
        size_bytes=size,
    )


# Series key (the sample line up to its value) -> (sample name, labels) as prometheus-client
# parsed it. A pod exports the same series every scrape and the pods of one model share them,
# so after the first scrape only the values are parsed, and every snapshot shares the label
# tuples (memory). Bounded: cleared when full.
_SERIES_CACHE: dict[str, tuple[str, Labels]] = {}
_SERIES_CACHE_MAX = 100_000


def _samples_cached(lines: list[str], keep: frozenset[str] | None = None):
    """(name, labels, value | None for a line prometheus-client rejects) per sample line (of a
    name in ``keep``, when given: the series cache makes skipping a known series a dict lookup).

    Each line goes through prometheus-client's sample parser (``_parse_sample``) the first time
    its series is seen and through its value parser after that. Family context is kept the way
    ``text_fd_to_metric_families`` keeps it: a sample named as its ``counter`` family without
    ``_total`` is renamed ``<name>_total``."""
    cache = _SERIES_CACHE
    fam, fam_counter = "", False
    for line in lines:
        line = line.strip()
        if not line:
            continue
        if line[0] == "#":
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] == "TYPE":
                fam, fam_counter = parts[2], len(parts) == 4 and parts[3].strip() == "counter"
            elif len(parts) >= 3 and parts[1] == "HELP" and parts[2] != fam:
                fam, fam_counter = parts[2], False
            continue
        brace = line.rfind("}")
        if brace >= 0 and " # " not in line:
            key, rest = line[: brace + 1], line[brace + 1:]
        elif brace < 0:
            key, _, rest = line.partition(" ") if " " in line else line.partition("\t")
            rest = " " + rest
        else:
            key, rest = "", ""  # an exemplar: no cache
        hit = cache.get(key) if key else None
        if hit is not None and keep is not None and hit[0] not in keep and hit[0] + "_total" not in keep:
            continue
        try:
            if hit is not None and rest[:1] in (" ", "\t"):
                name, labels = hit
                tok = rest.split()  # one plain number: what _parse_value reads (int or float, no '_')
                value = float(tok[0]) if len(tok) == 1 and "_" not in tok[0] else \
                    float(_parse_value_and_timestamp(rest)[0])
            else:
                sample = _parse_sample(line)
                name, labels, value = sample.name, tuple(sorted(sample.labels.items())), float(sample.value)
                if key:
                    if len(cache) >= _SERIES_CACHE_MAX:
                        cache.clear()
                    cache[key] = (name, labels)
        except Exception:  # prometheus-client raises ValueError, IndexError, ... on garbage
            m = _NAME_RE.match(line)
            if keep is None or (m and m.group(1) in keep):
                yield (m.group(1) if m else "<garbage>"), (), None
            continue
        if fam_counter and name == fam and not fam.endswith("_total"):
            name += "_total"
        if keep is None or name in keep:
            yield name, labels, value


def _samples_full(lines: list[str]):
    """The same as :func:`_samples_cached` through ``text_string_to_metric_families`` (used
    where prometheus-client's sample parser is not importable): the whole body, and line by line
    when it fails."""
    try:
        families = list(text_string_to_metric_families("\n".join(lines) + "\n"))
    except Exception:
        kept = []
        for line in lines:
            if not line.strip() or line.lstrip().startswith("#") or _line_ok(line):
                kept.append(line)
            else:
                m = _NAME_RE.match(line)
                yield (m.group(1) if m else "<garbage>"), (), None
        families = list(text_string_to_metric_families("\n".join(kept) + "\n"))
    for fam in families:
        for s in fam.samples:
            yield s.name, tuple(sorted(s.labels.items())), float(s.value)


async def scrape(
    url: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_bytes: int = DEFAULT_MAX_BYTES,
    session: aiohttp.ClientSession | None = None,
    keep: frozenset[str] | None = None,
) -> Snapshot:
    """GET ``url`` (a vLLM ``/metrics`` endpoint) and parse it.

    Raises a :class:`ScrapeError` subclass on timeout, connection failure, non-200 status, a
    body over ``max_bytes``, or a body cut short by the server (Content-Length not met).
    ``keep``: parse only these names (see :func:`parse_metrics`).
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s: expected > 0, got {timeout_s}")
    if max_bytes <= 0:
        raise ValueError(f"max_bytes: expected > 0, got {max_bytes}")
    own = session is None
    sess = aiohttp.ClientSession() if own else session
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with sess.get(url, timeout=timeout, headers={"Accept": "text/plain"}) as resp:
            if resp.status != 200:
                raise ScrapeHTTPError(url, resp.status)
            if resp.content_length is not None and resp.content_length > max_bytes:
                raise ScrapeTooLarge(url, f"Content-Length {resp.content_length} > max_bytes {max_bytes}")
            chunks: list[bytes] = []
            total = 0
            async for chunk in resp.content.iter_chunked(64 * 1024):
                total += len(chunk)
                if total > max_bytes:
                    raise ScrapeTooLarge(url, f"body exceeds max_bytes {max_bytes}")
                chunks.append(chunk)
            t_s = time.time()
    except ScrapeError:
        raise
    except TimeoutError as exc:  # asyncio.TimeoutError is TimeoutError on 3.11+
        raise ScrapeTimeout(url, f"no complete response within {timeout_s} s") from exc
    except aiohttp.ClientPayloadError as exc:
        raise ScrapeConnectionError(url, f"body cut short: {exc}") from exc
    except aiohttp.InvalidURL as exc:
        raise ScrapeConnectionError(url, f"invalid URL: {exc}") from exc
    except aiohttp.ClientError as exc:
        raise ScrapeConnectionError(url, f"{type(exc).__name__}: {exc}") from exc
    finally:
        if own:
            await sess.close()
    body = b"".join(chunks).decode("utf-8", errors="replace")
    return parse_metrics(body, url=url, t_s=t_s, keep=keep)
