"""A custom resource checked against its CRD's structural schema the way kube-apiserver does it.

One pass prunes unknown fields, drops nulls, applies defaults, checks types, enums, bounds,
lengths, patterns and required fields, then evaluates the schema's `x-kubernetes-validations`
CEL rules (with common-expression-language, cel-rust's bindings; the Kubernetes string extensions
the CRD uses are added). Each
failure is a `Cause` worded like apimachinery's field errors, so the emulated API answers what a
cluster answers and `kneecap.control.spec` reports the same field paths from the same rules.
"""

from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Mapping

import cel

from kneecap.control.quantity import canonical_quantity
from kneecap.errors import InputError

_DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")
_CEL_REASON = {"FieldValueInvalid": None, "FieldValueForbidden": "Forbidden",
               "FieldValueRequired": "Required value", "FieldValueDuplicate": "Duplicate value"}


@dataclass(frozen=True)
class Cause:
    """One field error: `reason` as in a Status' details.causes, `message` without the field."""

    field: str
    reason: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


def show(value: Any) -> str:
    """A value as apimachinery prints it in 'Invalid value: ...' (Go %#v for strings)."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else json.dumps(value)


def invalid(field: str, value: Any, detail: str) -> Cause:
    return Cause(field, "FieldValueInvalid", f"Invalid value: {show(value)}: {detail}")


def _typename(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(value), type(value).__name__)


def _schema_type(schema: Mapping) -> str:
    return "integer,string" if schema.get("x-kubernetes-int-or-string") else schema["type"]


def _type_ok(value: Any, schema: Mapping) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))
    typ = schema.get("type")
    if typ == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (isinstance(value, float) and value.is_integer())
    if typ == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return typ is None or _typename(value) == typ


class Walk:
    """Prune, default and validate one object; `unknown` is 'prune' (the API) or 'reject' (strict)."""

    def __init__(self, unknown: str = "prune"):
        self.unknown = unknown
        self.causes: list[Cause] = []
        self.unknown_fields: list[str] = []

    def value(self, value: Any, schema: Mapping, path: str, rule_path: str | None = None) -> Any:
        """`rule_path`: where a CEL rule's failure is reported (kube-apiserver writes a map value's
        as ``map[key]``, its schema errors as ``map.key``)."""
        if not _type_ok(value, schema):
            self.causes.append(invalid(path, _typename(value),
                                       f"{path} in body must be of type {_schema_type(schema)}: {show(_typename(value))}"))
            return value
        n_before = len(self.causes)
        if schema.get("type") == "integer" and isinstance(value, float):
            value = int(value)
        if "enum" in schema and value not in schema["enum"]:
            self.causes.append(Cause(path, "FieldValueNotSupported", f"Unsupported value: {show(value)}: "
                                     "supported values: " + ", ".join(show(e) for e in schema["enum"])))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            self._bounds(value, schema, path)
        elif isinstance(value, str):
            self._string(value, schema, path)
        elif isinstance(value, list):
            value = self._array(value, schema, path)
        elif isinstance(value, dict):
            value = self._object(value, schema, path)
        if len(self.causes) == n_before:
            self.causes.extend(cel_causes(value, schema, rule_path or path))
        return value

    def _bounds(self, value, schema, path) -> None:
        lo, hi = schema.get("minimum"), schema.get("maximum")
        if lo is not None and (value <= lo if schema.get("exclusiveMinimum") else value < lo):
            rel = "greater than" if schema.get("exclusiveMinimum") else "greater than or equal to"
            self.causes.append(invalid(path, value, f"{path} in body should be {rel} {lo}"))
        if hi is not None and (value >= hi if schema.get("exclusiveMaximum") else value > hi):
            rel = "less than" if schema.get("exclusiveMaximum") else "less than or equal to"
            self.causes.append(invalid(path, value, f"{path} in body should be {rel} {hi}"))

    def _string(self, value, schema, path) -> None:
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            self.causes.append(Cause(path, "FieldValueTooLong",
                                     f"Too long: may not be more than {schema['maxLength']} bytes"))
        if len(value) < schema.get("minLength", 0):
            self.causes.append(invalid(path, value, f"{path} in body should be at least {schema['minLength']} chars long"))
        if "pattern" in schema and not re.search(schema["pattern"], value):
            self.causes.append(invalid(path, value, f"{path} in body should match '{schema['pattern']}'"))
        if schema.get("format") == "date-time" and not _DATE_TIME.match(value):
            self.causes.append(invalid(path, value, f"{path} in body must be of type date-time: {show(value)}"))

    def _array(self, value, schema, path) -> list:
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            self.causes.append(Cause(path, "FieldValueTooMany",
                                     f"Too many: {len(value)}: must have at most {schema['maxItems']} items"))
        if len(value) < schema.get("minItems", 0):
            self.causes.append(invalid(path, value, f"{path} in body should have at least {schema['minItems']} items"))
        items = schema.get("items")
        if items is None:
            return copy.deepcopy(value)
        return [self.value(v, items, f"{path}[{i}]") for i, v in enumerate(value)]

    def _object(self, value, schema, path) -> dict:
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") or extra is True
        if "maxProperties" in schema and len(value) > schema["maxProperties"]:
            self.causes.append(Cause(path, "FieldValueTooMany",
                                     f"Too many: {len(value)}: must have at most {schema['maxProperties']} items"))
        out: dict = {}
        for key, v in value.items():
            sub = props.get(key, extra if isinstance(extra, dict) else None)
            if v is None and not (sub or {}).get("nullable"):
                continue  # nulls are pruned before defaulting
            if sub is not None:
                out[key] = self.value(v, sub, f"{path}.{key}", None if key in props else f"{path}[{key}]")
            elif keep_unknown:
                out[key] = copy.deepcopy(v)
            else:
                self.unknown_fields.append(f"{path}.{key}")
                if self.unknown == "reject":
                    known = ", ".join(props)
                    self.causes.append(Cause(f"{path}.{key}", "FieldValueNotSupported",
                                             f"Unsupported value: unknown field (known: {known})"))
        for key, sub in props.items():
            if key not in out and "default" in sub:
                out[key] = self.value(copy.deepcopy(sub["default"]), sub, f"{path}.{key}")
        for key in schema.get("required", []):
            if key not in out:
                self.causes.append(Cause(f"{path}.{key}", "FieldValueRequired", "Required value"))
        return out


_MISSING = object()
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def field_value(obj: Any, path: str) -> Any:
    """The value at a cause's field path ('spec.engine.extraArgs[1]') in `obj`; a sentinel when absent."""
    for key, index in _STEP.findall("." + path):
        if key and isinstance(obj, dict) and key in obj:
            obj = obj[key]
        elif index and isinstance(obj, list) and int(index) < len(obj):
            obj = obj[int(index)]
        else:
            return _MISSING
    return obj


def ratchet(causes: list[Cause], old: Any, new: Any) -> list[Cause]:
    """The causes an update introduced: a field left as it was may stay invalid (CRD validation
    ratcheting, on by default since Kubernetes 1.30), so a CRD that tightens a rule does not lock
    existing objects against unrelated writes (a finalizer, a label)."""
    return [c for c in causes if field_value(old, c.field) is _MISSING
            or field_value(old, c.field) != field_value(new, c.field)]


def check(value: Any, schema: Mapping, path: str, unknown: str = "prune") -> tuple[Any, list[Cause], list[str]]:
    """(pruned and defaulted copy, causes, unknown field paths) of `value` under `schema`."""
    walk = Walk(unknown)
    out = walk.value(value, schema, path)
    return out, walk.causes, walk.unknown_fields


# ---------------------------------------------------------------- CEL

def _is_quantity(text: str) -> bool:
    """Kubernetes' CEL `isQuantity` (library.Quantity): the string parses as a resource quantity."""
    try:
        canonical_quantity(text)
    except InputError:
        return False
    return True


# Kubernetes' CEL string extensions (cel-go ext.Strings) and quantity library that the CRD's rules use.
_FUNCTIONS = {
    "isQuantity": _is_quantity,
    "split": lambda s, sep: s.split(sep),
    "replace": lambda s, old, new: s.replace(old, new),
    "substring": lambda s, start, end=None: s[start:end],
    "lowerAscii": lambda s: s.lower(),
    "indexOf": lambda s, sub: s.find(sub),
    "join": lambda items, sep="": sep.join(items),
}


@functools.cache
def _program(expr: str) -> cel.Program:
    return cel.compile(expr)


def to_cel(value: Any, schema: Mapping | None) -> Any:
    """A JSON value as CEL sees it under `schema` (`number` fields are doubles even when whole)."""
    schema = schema or {}
    if isinstance(value, dict):
        props, extra = schema.get("properties") or {}, schema.get("additionalProperties")
        return {k: to_cel(v, props.get(k, extra if isinstance(extra, dict) else None)) for k, v in value.items()}
    if isinstance(value, list):
        return [to_cel(v, schema.get("items")) for v in value]
    if schema.get("type") == "number" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _evaluate(expr: str, context: cel.Context) -> Any:
    try:
        return _program(expr).execute(context)
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:
        raise CELError(f"{exc} evaluating rule: {expr}") from None


class CELError(Exception):
    """A rule that could not be evaluated (a missing field without has(), a type mismatch)."""


def cel_causes(value: Any, schema: Mapping, path: str) -> list[Cause]:
    """Failures of the `x-kubernetes-validations` rules declared on this node (not its children)."""
    rules = schema.get("x-kubernetes-validations") or []
    if not rules:
        return []
    context = cel.Context(variables={"self": to_cel(value, schema)}, functions=_FUNCTIONS)
    typ = schema.get("type", "object")
    out = []
    for rule in rules:
        try:
            ok = _evaluate(rule["rule"], context)
        except CELError as exc:
            out.append(invalid(path, typ, str(exc)))
            continue
        if ok is True:
            continue
        message = rule.get("message") or f"failed rule: {rule['rule']}"
        if rule.get("messageExpression"):
            try:
                message = str(_evaluate(rule["messageExpression"], context)) or message
            except CELError:
                pass
        reason = rule.get("reason", "FieldValueInvalid")
        prefix = _CEL_REASON.get(reason)
        # a string is shown as itself, an object or a list not at all (kube-apiserver 1.37)
        shown = f"{show(value)}: " if isinstance(value, str) else ""
        text = f"{prefix}: {message}" if prefix else f"Invalid value: {shown}{message}"
        out.append(Cause(path + rule.get("fieldPath", ""), reason, text))
    return out
