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
from itertools import repeat
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
        super().__init__(url, f"HTTP {status}" + (" (redirects are not followed)" if 300 <= status < 400 else ""))


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
                  keep: frozenset[str] | None = None, cache: ParseCache | None = None) -> Snapshot:
    """Parse a Prometheus text exposition into a :class:`Snapshot` (tolerant, see module doc).

    ``keep`` (from :func:`family_filter`): keep only the series of those names (a smaller
    snapshot; a known series not kept costs one dict lookup); the rest of the body is skipped
    and its garbage not recorded in ``invalid``. The truncation rule still applies to the whole
    body: a kept family is dropped only if the cut fell inside it. ``cache``: what earlier
    parses learned (the same result, faster on series seen before; None: this page alone)."""
    t_s = time.time() if t_s is None else t_s
    size = len(text) if text.isascii() else len(text.encode("utf-8", "replace"))
    truncated = bool(text) and not text.endswith("\n")
    lines = text.split("\n")
    if truncated:
        lines = lines[:-1]  # the partial last line
    elif lines and lines[-1] == "":
        lines = lines[:-1]
    # The family the cut fell in: the last one named by a sample or TYPE line (of the whole
    # body when filtered: a cut in a family not kept drops nothing kept).
    dropped_family = _last_family(lines) if truncated else None
    if _parse_sample is not None:
        series, invalid = _collect_cached(lines, keep, dropped_family, ParseCache() if cache is None else cache)
    else:
        if keep is not None:
            lines = [ln for ln in lines if _line_name(ln) in keep]
        series, invalid = _collect(_samples_full(lines), dropped_family)
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


def _collect(samples, dropped_family: str | None) -> tuple[dict[str, dict[Labels, float]], set[str]]:
    """Series and invalid names from (name, labels, value | None) samples: a None or non-finite
    value marks the name invalid, a sample of the family a cut fell in is dropped."""
    invalid: set[str] = set()
    series: dict[str, dict[Labels, float]] = {}
    for name, key, value in samples:
        if value is None:
            invalid.add(name)
            continue
        if dropped_family is not None and _family_of(name, {dropped_family}) == dropped_family:
            continue
        if not math.isfinite(value):
            invalid.add(name)
            continue
        series.setdefault(name, {})[key] = value
    return series, invalid


_SKIP = ()  # a line-cache entry: a known series not kept (see ParseCache)


class ParseCache:
    """What :func:`parse_metrics` learned from the pages it parsed, kept by its caller (the
    operator loop holds one for all its scrapes, a virtual-time run one per run).

    ``series``: a series key (the sample line up to its value) -> (sample name, labels) as
    prometheus-client parsed it. A pod exports the same series every scrape and the pods of one
    model share them, so after the first scrape only the values are parsed, and every snapshot
    shares the label tuples (memory).

    ``lines``: the line cache in front of it, one per ``keep`` set: a raw line's text before its
    last space (``line.rpartition(" ")[0]``) -> what the line means, so that a line seen before
    costs one rpartition and one dict lookup:
      _SKIP                                  a known series not kept: skip the line whatever its value
      (0, name, labels, name kept?)          a known series: parse the value after the space
      (1, rest, kind "TYPE"/"HELP"/"", family, counter?)  a comment line whose text after the
                                             space is ``rest`` (else the line is parsed afresh)
    A sample entry is made only for a key in ``series`` whose line is exactly "<key> <value>",
    so a hit reads the line as ``series`` would; a value that is not one plain float (a
    timestamp, '_', garbage) goes the long way. Emptied with ``series`` and bounded by the same
    size (``max_series``), at most ``max_keeps`` keep sets."""

    def __init__(self, max_series: int = 100_000, max_keeps: int = 16):
        self.series: dict[str, tuple[str, Labels]] = {}
        self.lines: dict[frozenset[str] | None, dict[str, tuple]] = {}
        self.max_series, self.max_keeps = max_series, max_keeps

    def clear(self) -> None:
        self.series.clear()
        self.lines.clear()

    def line_cache(self, keep: frozenset[str] | None) -> dict[str, tuple]:
        if not self.series or len(self.lines) >= self.max_keeps and keep not in self.lines:
            self.lines.clear()
        cache = self.lines.get(keep)
        if cache is None or len(cache) >= self.max_series:
            cache = self.lines[keep] = {}
        return cache


def _collect_cached(lines: list[str], keep: frozenset[str] | None, dropped_family: str | None,
                    cache: ParseCache) -> tuple[dict[str, dict[Labels, float]], set[str]]:
    """:func:`_collect` over the samples of the lines (tests/support/scrape_reference.py reads
    them line by line, the reference this must equal), with the line cache
    (``cache.lines``) in front: a line seen before is one rpartition, one dict lookup and, for
    a kept series, one float()."""
    fast = cache.line_cache(keep)
    invalid: set[str] = set()
    series: dict[str, dict[Labels, float]] = {}
    fam, fam_counter = "", False
    isfinite, get = math.isfinite, fast.get
    last_name, s = None, None
    for head, sep, val in map(str.rpartition, lines, repeat(" ")):
        e = get(head)
        if e is _SKIP:
            continue
        if e is not None:
            if e[0]:  # a comment line
                if val == e[1]:
                    if e[2] == "TYPE":
                        fam, fam_counter = e[3], e[4]
                    elif e[2] == "HELP" and e[3] != fam:
                        fam, fam_counter = e[3], False
                    continue
                e = None
            elif "_" in val:
                e = None
            else:
                try:
                    value = float(val)
                except ValueError:
                    e = None
        if e is None:
            got = _slow_line(head + sep + val, head, keep, fast, fam, fam_counter, cache)
            if got is None:
                continue
            if got[0] is None:  # a comment: the family context it sets
                fam, fam_counter = got[1], got[2]
                continue
            name, labels, value, kept = got
            if value is None:  # a line prometheus-client rejects (of a kept name)
                invalid.add(name)
                continue
        else:
            name, labels, kept = e[1], e[2], e[3]
        if fam_counter and name == fam and not fam.endswith("_total"):
            name += "_total"
            kept = keep is None or name in keep
        if not kept:
            continue
        if dropped_family is not None and _family_of(name, {dropped_family}) == dropped_family:
            continue
        if not isfinite(value):
            invalid.add(name)
            continue
        if name is not last_name:  # consecutive samples of one name: one series lookup
            s = series.get(name)
            if s is None:
                s = series[name] = {}
            last_name = name
        s[labels] = value
    return series, invalid


def _slow_line(raw: str, head: str, keep: frozenset[str] | None, fast: dict[str, tuple], fam: str,
               fam_counter: bool, parse_cache: ParseCache):
    """One line the line cache did not answer, read with prometheus-client's sample parser; fills
    both caches. Returns None (nothing to yield), ``(None, family, counter?)`` for a comment that
    sets the family context, or ``(name, labels, value | None, kept?)`` for a sample (None:
    prometheus-client rejects the line; ``kept`` before the counter renaming)."""
    line = raw.strip()
    if not line:
        return None
    if line[0] == "#":
        parts = line.split(None, 3)
        kind = parts[1] if len(parts) >= 3 and parts[1] in ("TYPE", "HELP") else ""
        family = parts[2] if kind else None
        counter = kind == "TYPE" and len(parts) == 4 and parts[3].strip() == "counter"
        if head:
            fast[head] = (1, raw[len(head) + 1:], kind, family, counter)
        if kind == "TYPE":
            return None, family, counter
        if kind == "HELP" and family != fam:
            return None, family, False
        return None
    cache = parse_cache.series
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
        if head == key:
            fast[head] = _SKIP
        return None
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
                if len(cache) >= parse_cache.max_series:
                    parse_cache.clear()  # the line caches' sample entries stand for series entries
                    fast.clear()
                cache[key] = (name, labels)
    except Exception:  # prometheus-client raises ValueError, IndexError, ... on garbage
        m = _NAME_RE.match(line)
        if keep is None or (m and m.group(1) in keep):
            return (m.group(1) if m else "<garbage>"), (), None, True
        return None
    if key and head == key:
        skip = keep is not None and name not in keep and name + "_total" not in keep
        fast[head] = _SKIP if skip else (0, name, labels, keep is None or name in keep)
    return name, labels, value, keep is None or name in keep


def _samples_full(lines: list[str]):
    """The samples of the lines through ``text_string_to_metric_families`` (used
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
    cache: ParseCache | None = None,
) -> Snapshot:
    """GET ``url`` (a vLLM ``/metrics`` endpoint) and parse it.

    Raises a :class:`ScrapeError` subclass on timeout, connection failure, non-200 status (a
    redirect included: it is not followed), a body over ``max_bytes``, or a body cut short by
    the server (Content-Length not met).
    ``keep``, ``cache``: see :func:`parse_metrics`.
    """
    if timeout_s <= 0:
        raise ValueError(f"timeout_s: expected > 0, got {timeout_s}")
    if max_bytes <= 0:
        raise ValueError(f"max_bytes: expected > 0, got {max_bytes}")
    own = session is None
    sess = aiohttp.ClientSession() if own else session
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        # redirects are not followed: a target could send the operator anywhere
        async with sess.get(url, timeout=timeout, headers={"Accept": "text/plain"}, allow_redirects=False) as resp:
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
    return parse_metrics(body, url=url, t_s=t_s, keep=keep, cache=cache)
