"""Label-selector shards: `kneecap run --selector SELECTOR` acts on the LLMDeployments whose labels
match SELECTOR and on no other (not even to add its finalizer).

The selector is a Kubernetes label selector (the syntax of `kubectl -l`): comma-separated
requirements, each ``key``, ``!key``, ``key=value`` (or ``==``), ``key!=value``,
``key in (v1,v2)`` or ``key notin (v1,v2)``; all must hold. ``!=`` and ``notin`` also match a
resource without the key, as Kubernetes' own selectors do.

kopf filters every LLMDeployment handler with it (`kopf_filters`): the requirements kopf's
``labels=`` filter expresses (``key=value``, ``key``, ``!key``) go there, the others into a
``when=`` callback. kopf then adds its finalizer only to matching resources and, when a resource's
labels stop matching (relabelled to another shard), removes its finalizer and stops its timer.

Each shard has a finalizer of its own (`finalizer`): kopf removes its finalizer from any
resource of the kind that no handler of it matches, so two shards sharing one finalizer name
would each strip the other's. An unsharded operator keeps ``kneecap.io/finalizer``. An operator
releases the other kneecap finalizers from the resources it reconciles
(`release_other_finalizers`): those of an operator that managed them before a split, a merge or
a selector change, which would otherwise hold their deletion once that operator is gone.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from typing import Any

from kneecap.errors import InputError

UNSHARDED_FINALIZER = "kneecap.io/finalizer"

_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?(?:\.[a-z0-9](?:[-a-z0-9]*[a-z0-9])?)*"
_KEY = re.compile(rf"(?:({_DNS_SUBDOMAIN})/)?({_NAME})")
_VALUE = re.compile(rf"(?:{_NAME})?")
_EXISTS = re.compile(r"(!?)\s*(\S+)")
_EQUALITY = re.compile(r"([^\s=!]+)\s*(==|=|!=)\s*(\S*)")
_SET = re.compile(r"([^\s=!(]+)\s+(in|notin)\s*\((.*)\)")

OPERATORS = ("exists", "!", "=", "!=", "in", "notin")


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # one of OPERATORS
    values: tuple[str, ...] = ()

    def matches(self, labels: dict) -> bool:
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!":
            return not present
        value = labels.get(self.key)
        if self.op in ("=", "in"):
            return present and value in self.values
        return not present or value not in self.values  # "!=", "notin"

    def __str__(self) -> str:
        if self.op == "exists":
            return self.key
        if self.op == "!":
            return f"!{self.key}"
        if self.op in ("=", "!="):
            return f"{self.key}{self.op}{self.values[0]}"
        return f"{self.key} {self.op} ({','.join(self.values)})"


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...]

    def matches(self, labels: dict | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    def __str__(self) -> str:
        """The canonical form: requirements sorted (as Kubernetes prints a selector), values sorted."""
        return ",".join(sorted(str(r) for r in self.requirements))

    @property
    def finalizer(self) -> str:
        """This shard's finalizer: stable for equivalent spellings of the selector."""
        return f"{UNSHARDED_FINALIZER}-{hashlib.sha256(str(self).encode()).hexdigest()[:10]}"


def _split(text: str) -> list[str]:
    """The requirements of a selector: split at commas outside parentheses."""
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
            if depth > 1:
                raise ValueError("nested parentheses")
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ValueError("')' without '('")
        elif ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("'(' without ')'")
    return terms + [text[start:]]


def _key(text: str) -> str:
    m = _KEY.fullmatch(text)
    if m is None or (m.group(1) and len(m.group(1)) > 253):
        raise ValueError(f"invalid label key {text!r} (a qualified name: [prefix/]name, name at most 63 "
                         "characters of [A-Za-z0-9-_.], beginning and ending alphanumeric)")
    return text


def _value(text: str) -> str:
    if not _VALUE.fullmatch(text):
        raise ValueError(f"invalid label value {text!r} (at most 63 characters of [A-Za-z0-9-_.], "
                         "beginning and ending alphanumeric, or empty)")
    return text


def _requirement(term: str) -> Requirement:
    term = term.strip()
    if not term:
        raise ValueError("empty requirement (a stray comma?)")
    if m := _SET.fullmatch(term):
        values = [v.strip() for v in m.group(3).split(",")]
        if values == [""]:
            raise ValueError(f"{term!r}: '{m.group(2)}' needs at least one value")
        return Requirement(_key(m.group(1)), m.group(2), tuple(sorted(set(map(_value, values)))))
    if m := _EQUALITY.fullmatch(term):
        return Requirement(_key(m.group(1)), "!=" if m.group(2) == "!=" else "=", (_value(m.group(3)),))
    if (m := _EXISTS.fullmatch(term)) and not any(c in m.group(2) for c in "=()!"):
        return Requirement(_key(m.group(2)), "!" if m.group(1) else "exists")
    raise ValueError(f"cannot parse {term!r} (expected key, !key, key=value, key!=value, "
                     "key in (v1,v2) or key notin (v1,v2))")


def parse_selector(text: str, flag: str = "--selector") -> LabelSelector:
    """A label selector from its text; InputError naming `flag` when it is malformed or empty."""
    if not text or not text.strip():
        raise InputError(flag, "expected a label selector (e.g. kneecap.io/shard=a), got an empty one; "
                               "leave the flag out to act on every LLMDeployment")
    try:
        return LabelSelector(tuple(_requirement(t) for t in _split(text)))
    except ValueError as exc:
        raise InputError(flag, f"malformed label selector {text!r}: {exc}") from None


def kopf_filters(selector: LabelSelector | None) -> dict[str, Any]:
    """The ``labels=`` and ``when=`` keyword arguments that restrict a kopf handler to the
    resources `selector` matches ({} without a selector). Equality and existence requirements
    go to kopf's label filter (one per key), the rest (and a second requirement on a key) to a
    ``when`` callback."""
    import kopf

    if selector is None:
        return {}
    labels: dict[str, Any] = {}
    rest: list[Requirement] = []
    for r in selector.requirements:
        if r.key in labels or r.op not in ("=", "exists", "!"):
            rest.append(r)
        else:
            labels[r.key] = r.values[0] if r.op == "=" else kopf.PRESENT if r.op == "exists" else kopf.ABSENT
    out: dict[str, Any] = {"labels": labels} if labels else {}
    if rest:
        out["when"] = functools.partial(_when, tuple(rest))
    return out


def _when(requirements: tuple[Requirement, ...], labels: dict | None = None, **_) -> bool:
    labels = labels or {}
    return all(r.matches(labels) for r in requirements)


def finalizer(selector: LabelSelector | None) -> str:
    """The finalizer an operator with `selector` (None: unsharded) puts on its LLMDeployments."""
    return UNSHARDED_FINALIZER if selector is None else selector.finalizer


def is_kneecap_finalizer(name: str) -> bool:
    """kneecap's finalizer, unsharded or of any shard."""
    return name == UNSHARDED_FINALIZER or name.startswith(UNSHARDED_FINALIZER + "-")


def _drop_finalizers(body: dict, names: frozenset[str]) -> None:
    finalizers = (body.get("metadata") or {}).get("finalizers")
    if finalizers and names & set(finalizers):
        finalizers[:] = [f for f in finalizers if f not in names]


def release_other_finalizers(own: str, body, patch) -> list[str]:
    """The kneecap finalizers on a resource this operator serves other than its own `own`
    (the unsharded operator's when the resource predates a split into shards, a shard's when
    it predates a merge back or a shard's selector changed), removed in the handler's own patch
    (kopf's patch functions: a JSON patch against the stored finalizer list), so that no finalizer
    whose operator is gone holds the resource's deletion. Only one operator matches a resource
    when the selectors are disjoint; the one that matches it is the one left to release them.
    Returns the names released."""
    other = sorted(f for f in ((body.get("metadata") or {}).get("finalizers") or [])
                   if is_kneecap_finalizer(f) and f != own)
    if other:
        patch.fns.append(functools.partial(_drop_finalizers, names=frozenset(other)))
    return other
