"""The line-by-line sample reader that :func:`kneecap.observe.scrape._collect_cached` (the line
cache parse_metrics uses) is tested against: the same samples, without the line cache."""

from __future__ import annotations

from kneecap.observe.scrape import _NAME_RE, ParseCache, _parse_sample, _parse_value_and_timestamp


def reference_samples(lines: list[str], keep: frozenset[str] | None = None, parse_cache: ParseCache | None = None):
    """(name, labels, value | None for a line prometheus-client rejects) per sample line (of a
    name in ``keep``, when given: the series cache makes skipping a known series a dict lookup).

    Each line goes through prometheus-client's sample parser (``_parse_sample``) the first time
    its series is seen and through its value parser after that. Family context is kept the way
    ``text_fd_to_metric_families`` keeps it: a sample named as its ``counter`` family without
    ``_total`` is renamed ``<name>_total``."""
    parse_cache = ParseCache() if parse_cache is None else parse_cache
    cache = parse_cache.series
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
                    if len(cache) >= parse_cache.max_series:
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
