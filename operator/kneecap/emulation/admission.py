"""What kube-apiserver does to an object on a write, as pure functions the emulated API applies.

* names and labels are validated per kind (apimachinery/pkg/util/validation);
* Deployments, Pods and Services get the server's defaults (pkg/apis/*/v1/defaults.go), resource
  quantities in their canonical form and empty fields dropped (omitempty), so a client that
  compares what it sent with what is stored sees what a cluster would show it;
* the strategic merge patch merges lists by their keys (containers by name, env by name...);
* `managedFields` record which manager last wrote each field (a coarse FieldsV1: maps are
  followed, lists are leaves).

Each check returns `validation.Cause`s, which the emulated API turns into a 422 Status; a body
that cannot be decoded (a malformed quantity) raises DecodeError, a 400.
"""

from __future__ import annotations

import copy
import datetime
import json
import re
from types import MappingProxyType
from typing import Any

from kneecap.control.drift import omitted_zero as _omitted_zero
from kneecap.control.quantity import canonical_quantity
from kneecap.control.validation import Cause, invalid
from kneecap.errors import InputError

_DNS1123_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_SUBDOMAIN = re.compile(rf"^{_DNS1123_LABEL}(\.{_DNS1123_LABEL})*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")

SUBDOMAIN_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                 "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                 "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
DNS1035_MSG = ("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an "
               "alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', "
               "regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')")
DNS1123_LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and "
                     "must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex "
                     "used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")
LABEL_VALUE_MSG = ("a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', "
                   "and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or "
                   "'12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')")
NAME_PART_MSG = ("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with "
                 "an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                 "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')")


# ---------------------------------------------------------------- generation

def next_generation(old: dict, new: dict) -> int:
    """``metadata.generation`` after a write of `new` over `old`: one more when ``spec`` changed, as
    kube-apiserver counts it for custom resources with a status subresource, Deployments and
    ReplicaSets (writes to metadata or status leave it; a Deployment's annotations, which the
    real server also counts, do not)."""
    generation = int(old.get("metadata", {}).get("generation", 1))
    return generation + 1 if new.get("spec") != old.get("spec") else generation


# ---------------------------------------------------------------- names and labels

def name_causes(kind: str, name: Any) -> list[Cause]:
    """metadata.name: a DNS-1035 label for Services, a DNS-1123 label for Namespaces, else a subdomain."""
    path = "metadata.name"
    if not isinstance(name, str) or not name:
        return [Cause(path, "FieldValueRequired", "Required value: name or generateName is required")]
    if kind == "Service":
        limit, ok, msg = 63, _DNS1035_LABEL.match(name), DNS1035_MSG
    elif kind == "Namespace":
        limit, ok, msg = 63, re.match(rf"^{_DNS1123_LABEL}$", name), DNS1123_LABEL_MSG
    else:
        limit, ok, msg = 253, _DNS1123_SUBDOMAIN.match(name), SUBDOMAIN_MSG
    out = []
    if len(name) > limit:
        out.append(invalid(path, name, f"must be no more than {limit} characters"))
    if not ok:
        out.append(invalid(path, name, msg))
    return out


def label_causes(labels: Any, path: str = "metadata.labels") -> list[Cause]:
    """Label keys are qualified names (optional DNS subdomain prefix), values ≤ 63 label characters."""
    if labels is None:
        return []
    if not isinstance(labels, dict):
        return [invalid(path, labels, "must be a map of string keys to string values")]
    out = []
    for key, value in labels.items():
        prefix, _, name_part = key.rpartition("/")
        if not name_part or len(name_part) > 63 or not _QUALIFIED_NAME.match(name_part):
            out.append(invalid(path, key, NAME_PART_MSG if name_part and len(name_part) <= 63
                               else "name part must be no more than 63 characters" if name_part
                               else "name part must be non-empty"))
        if prefix and (len(prefix) > 253 or not _DNS1123_SUBDOMAIN.match(prefix)):
            out.append(invalid(path, key, "prefix part " + SUBDOMAIN_MSG))
        if not isinstance(value, str):
            out.append(invalid(path, value, "label values must be strings"))
            continue
        if len(value) > 63:
            out.append(invalid(path, value, "must be no more than 63 bytes"))
        if not _LABEL_VALUE.match(value):
            out.append(invalid(path, value, LABEL_VALUE_MSG))
    return out


# ---------------------------------------------------------------- defaults, quantities, omitempty

class DecodeError(Exception):
    """A body the API server cannot decode into its Go type (a 400, before any validation)."""


# Go maps and slices are omitempty in the API types: an empty one is not stored.
_MAP_FIELDS = frozenset({"labels", "annotations", "nodeSelector", "limits", "requests", "matchLabels", "selector",
                         "data"})


def drop_empty(value: Any, key: str = "") -> Any:
    """Nulls, empty lists and empty maps (the Go map fields) removed, as omitempty serialises them."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            v = drop_empty(v, k)
            if v is None or v == [] or (v == {} and k in _MAP_FIELDS) or _omitted_zero(k, v):
                continue
            out[k] = v
        return out
    if isinstance(value, list):
        return [drop_empty(v, key) for v in value]
    return value


def _probe_defaults(probe: dict) -> None:
    for k, v in (("timeoutSeconds", 1), ("periodSeconds", 10), ("successThreshold", 1), ("failureThreshold", 3)):
        probe.setdefault(k, v)
    if "httpGet" in probe:
        probe["httpGet"].setdefault("scheme", "HTTP")


def _image_pull_policy(image: str) -> str:
    """Always for ':latest' or an untagged image, else IfNotPresent (SetDefaults_Container)."""
    last = image.rsplit("/", 1)[-1]
    if "@" in last:
        return "IfNotPresent"
    return "Always" if ":" not in last or last.endswith(":latest") else "IfNotPresent"


def _container_defaults(c: dict) -> None:
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    if isinstance(c.get("image"), str):
        c.setdefault("imagePullPolicy", _image_pull_policy(c["image"]))
    c.setdefault("resources", {})
    for p in c.get("ports") or []:
        p.setdefault("protocol", "TCP")
    for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
        if isinstance(c.get(probe), dict):
            _probe_defaults(c[probe])
    for e in c.get("env") or []:
        ref = (e.get("valueFrom") or {}).get("fieldRef")
        if isinstance(ref, dict):
            ref.setdefault("apiVersion", "v1")
    for part in ("limits", "requests"):
        amounts = c["resources"].get(part)
        if not isinstance(amounts, dict):
            continue
        for name, amount in list(amounts.items()):
            try:
                amounts[name] = canonical_quantity(amount)
            except InputError:
                raise DecodeError("quantities must match the regular expression "
                                  "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'") from None


def _volume_defaults(volume: dict) -> None:
    """defaultMode 0644 of projected files (SetDefaults_*VolumeSource); emptyDir's sizeLimit canonical."""
    for source in ("configMap", "secret", "downwardAPI", "projected"):
        if isinstance(volume.get(source), dict):
            volume[source].setdefault("defaultMode", 0o644)
    empty_dir = volume.get("emptyDir")
    if isinstance(empty_dir, dict) and "sizeLimit" in empty_dir:
        try:
            empty_dir["sizeLimit"] = canonical_quantity(empty_dir["sizeLimit"])
        except InputError:
            raise DecodeError("quantities must match the regular expression "
                              "'^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'") from None


def pod_spec_defaults(spec: dict) -> None:
    spec.setdefault("restartPolicy", "Always")
    for volume in spec.get("volumes") or []:
        if isinstance(volume, dict):
            _volume_defaults(volume)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    if spec.get("serviceAccountName"):  # the deprecated mirror the API server still fills in
        spec.setdefault("serviceAccount", spec["serviceAccountName"])
    spec.setdefault("securityContext", {})
    for group in ("initContainers", "containers"):
        for c in spec.get(group) or []:
            if isinstance(c, dict):
                _container_defaults(c)


def _deployment_defaults(obj: dict) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("replicas", 1)
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    strategy = spec.setdefault("strategy", {})
    strategy.setdefault("type", "RollingUpdate")
    if strategy["type"] == "RollingUpdate":
        ru = strategy.setdefault("rollingUpdate", {})
        ru.setdefault("maxUnavailable", "25%")
        ru.setdefault("maxSurge", "25%")
    template = spec.setdefault("template", {})
    pod_spec_defaults(template.setdefault("spec", {}))


def _service_defaults(obj: dict, cluster_ip: str) -> None:
    spec = obj.setdefault("spec", {})
    spec.setdefault("type", "ClusterIP")
    spec.setdefault("sessionAffinity", "None")
    if spec["type"] != "ExternalName":
        spec.setdefault("clusterIP", cluster_ip)
        spec.setdefault("clusterIPs", [spec["clusterIP"]])
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("internalTrafficPolicy", "Cluster")
    for p in spec.get("ports") or []:
        p.setdefault("protocol", "TCP")
        p.setdefault("targetPort", p.get("port"))
    obj.setdefault("status", {}).setdefault("loadBalancer", {})


def deployment_causes(old: dict | None, new: dict) -> list[Cause]:
    """The selector selects the template's labels and never changes (apps/v1 ValidateDeploymentUpdate)."""
    spec = new.get("spec") or {}
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
    out = []
    if not selector:
        out.append(Cause("spec.selector", "FieldValueRequired", "Required value"))
    elif any(labels.get(k) != v for k, v in selector.items()):
        out.append(Cause("spec.template.metadata.labels", "FieldValueInvalid",
                         f"Invalid value: {json.dumps(labels, sort_keys=True, separators=(',', ':'))}: "
                         "`selector` does not match template `labels`"))
    if old is not None and (old.get("spec") or {}).get("selector") != spec.get("selector"):
        out.append(Cause("spec.selector", "FieldValueInvalid",
                         f"Invalid value: {json.dumps({'matchLabels': selector}, sort_keys=True, separators=(',', ':'))}: "
                         "field is immutable"))
    for i, c in enumerate((spec.get("template") or {}).get("spec", {}).get("containers") or []):
        for key in ("name", "image"):
            if not c.get(key):
                out.append(Cause(f"spec.template.spec.containers[{i}].{key}", "FieldValueRequired", "Required value"))
    return out


def server_defaults(kind: str, obj: dict, cluster_ip: str = "10.96.0.10") -> None:
    """Apply the API server's defaults to a Deployment, Pod or Service in place (DecodeError on a bad quantity)."""
    if kind == "Deployment":
        _deployment_defaults(obj)
    elif kind == "Pod":
        pod_spec_defaults(obj.setdefault("spec", {}))
        obj["spec"].setdefault("enableServiceLinks", True)
    elif kind == "Service":
        _service_defaults(obj, cluster_ip)


# ---------------------------------------------------------------- strategic merge patch

# patchMergeKey of the list fields (k8s.io/api struct tags); other lists are replaced.
_MERGE_KEYS = MappingProxyType({
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name", "env": "name", "volumes": "name",
    "volumeMounts": "mountPath", "volumeDevices": "devicePath", "imagePullSecrets": "name", "ownerReferences": "uid",
    "conditions": "type", "hostAliases": "ip", "resourceClaims": "name"})
_SET_LISTS = frozenset({"finalizers"})  # primitive lists merged as sets (patchStrategy:merge)


def _merge_key(field: str, parent_path: tuple[str, ...]) -> str | None:
    if field == "ports":
        return "containerPort" if "containers" in parent_path or "initContainers" in parent_path else "port"
    return _MERGE_KEYS.get(field)


def strategic_merge(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """Strategic merge patch: maps merge, null deletes, keyed lists merge item by item, `$patch` directives."""
    if not isinstance(patch, dict) or not isinstance(target, dict):
        return copy.deepcopy({k: v for k, v in patch.items() if not k.startswith("$")} if isinstance(patch, dict) else patch)
    if patch.get("$patch") == "replace":
        return copy.deepcopy({k: v for k, v in patch.items() if not k.startswith("$")})
    if patch.get("$patch") == "delete":
        return None
    out = copy.deepcopy(target)
    for k, v in patch.items():
        if k.startswith("$"):
            continue
        if v is None:
            out.pop(k, None)
        elif isinstance(v, list) and isinstance(out.get(k), list) and (key := _merge_key(k, path)):
            out[k] = _merge_list(out[k], v, key, path + (k,))
        elif isinstance(v, list) and isinstance(out.get(k), list) and k in _SET_LISTS:
            out[k] = out[k] + [x for x in v if x not in out[k]]
        else:
            merged = strategic_merge(out.get(k), v, path + (k,))
            if merged is None:
                out.pop(k, None)
            else:
                out[k] = merged
    return out


def _merge_list(current: list, patch: list, key: str, path: tuple[str, ...]) -> list:
    out = copy.deepcopy(current)
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            out.append(copy.deepcopy(item))
            continue
        at = next((i for i, x in enumerate(out) if isinstance(x, dict) and x.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                out.pop(at)
        elif at is None:
            out.append({k: v for k, v in copy.deepcopy(item).items() if not k.startswith("$")})
        else:
            out[at] = strategic_merge(out[at], item, path)
    return out


# ---------------------------------------------------------------- managedFields

def field_set(value: Any) -> dict:
    """FieldsV1 of an object's content: `f:<key>` for every map key, lists as leaves."""
    if not isinstance(value, dict):
        return {}
    return {f"f:{k}": field_set(v) for k, v in value.items()}


def _changed(old: Any, new: Any) -> dict | None:
    """FieldsV1 of what `new` sets differently from `old` (None when nothing)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = {}
        for k, v in new.items():
            sub = _changed(old.get(k), v) if k in old else field_set(v)
            if sub is not None:
                out[f"f:{k}"] = sub
        return out or None
    return None if old == new else field_set(new)


def _subtract(owned: dict, taken: dict) -> dict:
    """`owned` without the leaves in `taken` (a field another manager wrote is no longer yours)."""
    out = {}
    for k, v in owned.items():
        if k not in taken:
            out[k] = v
        elif taken[k] and v:
            rest = _subtract(v, taken[k])
            if rest:
                out[k] = rest
    return out


def _union(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _union(out.get(k) or {}, v) if k in out else v
    return out


def _content(obj: dict | None, subresource: str | None) -> dict:
    if not obj:
        return {}
    if subresource == "status":
        return {"status": obj.get("status")} if "status" in obj else {}
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k in ("labels", "annotations", "ownerReferences", "finalizers")}
    return {**({"metadata": meta} if meta else {}),
            **{k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}}


def record_managed_fields(old: dict | None, new: dict, manager: str, subresource: str | None,
                          operation: str) -> None:
    """Update new.metadata.managedFields: `manager` takes the fields this write set or changed."""
    entries = copy.deepcopy((old or {}).get("metadata", {}).get("managedFields") or [])
    taken = _changed(_content(old, subresource), _content(new, subresource)) or {}
    if not taken:
        new["metadata"]["managedFields"] = entries
        return
    now = datetime.datetime.now(tz=datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    kept, mine = [], {}
    for e in entries:
        fields = _subtract(e.get("fieldsV1") or {}, taken)
        if e.get("manager") == manager and e.get("operation") == operation and e.get("subresource") == subresource:
            mine = fields
        elif fields:
            kept.append({**e, "fieldsV1": fields})
    entry = {"manager": manager, "operation": operation, "apiVersion": new.get("apiVersion", "v1"),
             "time": now, "fieldsType": "FieldsV1", "fieldsV1": _union(mine, taken)}
    if subresource:
        entry["subresource"] = subresource
    new["metadata"]["managedFields"] = kept + [entry]
