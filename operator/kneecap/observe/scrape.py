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


def _family_of(sample_name: str, family_names: set[str]) -> str:
    for suffix in ("_bucket", "_count", "_sum", "_total", "_created", "_gcount", "_gsum", "_info"):
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


def parse_metrics(text: str, *, url: str = "", t_s: float | None = None) -> Snapshot:
    """Parse a Prometheus text exposition into a :class:`Snapshot` (tolerant, see module doc)."""
    t_s = time.time() if t_s is None else t_s
    size = len(text.encode("utf-8", "replace"))
    lines = text.split("\n")
    truncated = bool(text) and not text.endswith("\n")
    if truncated:
        lines = lines[:-1]  # the partial last line
    elif lines and lines[-1] == "":
        lines = lines[:-1]
    invalid: set[str] = set()
    clean = "\n".join(lines) + "\n"
    try:
        families = list(text_string_to_metric_families(clean))
    except Exception:
        kept = []
        for line in lines:
            if not line.strip() or line.lstrip().startswith("#") or _line_ok(line):
                kept.append(line)
            else:
                m = _NAME_RE.match(line)
                invalid.add(m.group(1) if m else "<garbage>")
        lines = kept
        families = list(text_string_to_metric_families("\n".join(lines) + "\n"))

    dropped_family = None
    if truncated:
        # The family the cut fell in: the last one named by a sample or TYPE line.
        declared = {m.group(1) for line in lines if (m := _TYPE_RE.match(line))}
        for line in reversed(lines):
            m = _TYPE_RE.match(line) or (None if line.startswith("#") else _NAME_RE.match(line))
            if m:
                dropped_family = _family_of(m.group(1), declared)
                break

    series: dict[str, dict[Labels, float]] = {}
    for fam in families:
        if dropped_family is not None and fam.name == dropped_family:
            continue
        for s in fam.samples:
            if dropped_family is not None and _family_of(s.name, {dropped_family}) == dropped_family:
                continue
            if not math.isfinite(s.value):
                invalid.add(s.name)
                continue
            key = tuple(sorted(s.labels.items()))
            series.setdefault(s.name, {})[key] = float(s.value)
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


async def scrape(
    url: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_bytes: int = DEFAULT_MAX_BYTES,
    session: aiohttp.ClientSession | None = None,
) -> Snapshot:
    """GET ``url`` (a vLLM ``/metrics`` endpoint) and parse it.

    Raises a :class:`ScrapeError` subclass on timeout, connection failure, non-200 status, a
    body over ``max_bytes``, or a body cut short by the server (Content-Length not met).
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
    return parse_metrics(body, url=url, t_s=t_s)
