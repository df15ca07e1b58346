"""Label-selector shards (kneecap.control.shard): `kneecap run --selector` parsed as Kubernetes parses
a label selector, malformed ones refused naming the flag (exit 2), matching as Kubernetes
matches, and every LLMDeployment handler of the registry filtered by it (kopf's own label and
`when` filters, evaluated here by kopf's matching functions). The two shards on the real API:
tests/kube/test_sharding.py."""

from __future__ import annotations

from types import SimpleNamespace

import kopf
import pytest
from kopf._core.intents import registries

from kneecap.cli import main
from kneecap.control import handlers
from kneecap.control.shard import (UNSHARDED_FINALIZER, finalizer, kopf_filters, parse_selector,
                                   release_other_finalizers)
from kneecap.errors import InputError

A = {"kneecap.io/shard": "a"}
B = {"kneecap.io/shard": "b"}
NONE: dict = {}


@pytest.mark.parametrize("text, labels, matches", [
    ("kneecap.io/shard=a", A, True),
    ("kneecap.io/shard=a", B, False),
    ("kneecap.io/shard=a", NONE, False),
    ("kneecap.io/shard==a", A, True),
    ("kneecap.io/shard!=a", A, False),
    ("kneecap.io/shard!=a", B, True),
    ("kneecap.io/shard!=a", NONE, True),            # != matches a resource without the key
    ("kneecap.io/shard in (a, b)", B, True),
    ("kneecap.io/shard in (a,b)", {"kneecap.io/shard": "c"}, False),
    ("kneecap.io/shard in (a,b)", NONE, False),
    ("kneecap.io/shard notin (a,b)", {"kneecap.io/shard": "c"}, True),
    ("kneecap.io/shard notin (a,b)", NONE, True),   # notin too
    ("kneecap.io/shard notin (a,b)", A, False),
    ("kneecap.io/shard", A, True),
    ("kneecap.io/shard", NONE, False),
    ("!kneecap.io/shard", NONE, True),
    ("!kneecap.io/shard", A, False),
    ("team=x, kneecap.io/shard in (a,c)", {**A, "team": "x"}, True),
    ("team=x,kneecap.io/shard in (a,c)", A, False),
    ("tier=", {"tier": ""}, True),                  # an empty value is a value
    ("tier=", NONE, False),
])
def test_selector_matches_as_kubernetes_does(text, labels, matches):
    assert parse_selector(text).matches(labels) is matches


@pytest.mark.parametrize("text", [
    "", "  ", "a=b,", ",a=b", "a=b,,c=d", "a in ()", "a in (b", "a in b)", "a in ((b))", "=b",
    "a=b=c", "a b", "-a=b", "a=-b", "a=" + "x" * 64, "x" * 64 + "=b", "Bad_Prefix.io/a=b", "a/b/c=d",
    "a > 3", "a in (b,c", "!a=b", "a in (b!)",
])
def test_a_malformed_selector_is_refused_naming_the_flag(text):
    with pytest.raises(InputError) as err:
        parse_selector(text, "--selector")
    assert err.value.field == "--selector"


def test_the_cli_refuses_a_malformed_selector_with_exit_2(capsys):
    assert main(["run", "--selector", "kneecap.io/shard in (a"]) == 2
    err = capsys.readouterr().err
    assert "--selector" in err and "'(' without ')'" in err


def test_equivalent_spellings_share_a_canonical_form_and_finalizer():
    one = parse_selector("team=x,kneecap.io/shard in (b, a)")
    two = parse_selector(" kneecap.io/shard in (a,b) , team==x")
    assert str(one) == str(two) == "kneecap.io/shard in (a,b),team=x"
    assert one.finalizer == two.finalizer
    a, b = parse_selector("kneecap.io/shard=a"), parse_selector("kneecap.io/shard=b")
    assert len({a.finalizer, b.finalizer, UNSHARDED_FINALIZER}) == 3  # shards never strip each other's
    assert finalizer(None) == UNSHARDED_FINALIZER == "kneecap.io/finalizer"  # an unsharded install unchanged
    # a finalizer is a qualified name: prefix/name, the name at most 63 characters
    assert a.finalizer.startswith("kneecap.io/") and len(a.finalizer.split("/")[1]) <= 63


def test_kopf_label_filters_where_they_express_the_selector_a_when_callback_for_the_rest():
    assert kopf_filters(None) == {}
    assert kopf_filters(parse_selector("kneecap.io/shard=a")) == {"labels": {"kneecap.io/shard": "a"}}
    assert kopf_filters(parse_selector("a,!b")) == {"labels": {"a": kopf.PRESENT, "b": kopf.ABSENT}}
    f = kopf_filters(parse_selector("team=x,kneecap.io/shard notin (a)"))
    assert f["labels"] == {"team": "x"}
    assert f["when"](labels=B) and not f["when"](labels=A) and f["when"](labels=NONE)


def cause(labels: dict) -> SimpleNamespace:
    body = {"metadata": {"name": "llm", "namespace": "ns", "labels": labels}}
    return SimpleNamespace(body=body, kwargs={"labels": labels, "body": body})


def llmd_handlers(registry: kopf.OperatorRegistry) -> list:
    return [h for r in (registry._changing, registry._spawning) for h in r.get_all_handlers()]


def matched(handler, labels: dict) -> bool:
    """kopf's own label and callback filters (those prematch/match apply) on a resource with `labels`."""
    c = cause(labels)
    return registries._matches_labels(handler, c, {}) and registries._matches_filter_callback(handler, c, {})


@pytest.mark.parametrize("text", ["kneecap.io/shard=a", "kneecap.io/shard in (a,x)", "kneecap.io/shard notin (b)"])
def test_every_llmdeployment_handler_acts_on_its_shard_only(text):
    registry = handlers.build_registry(handlers.OperatorConfig(selector=parse_selector(text)))
    found = llmd_handlers(registry)
    assert {h.id for h in found} >= {"reconcile", "control", "delete"}
    assert len(found) >= 5  # resume, create, update, delete, the control timer
    for h in found:
        assert matched(h, A), h.id
        assert not matched(h, B), h.id
        assert not matched(h, {**B, "team": "x"}), h.id


def test_without_a_selector_every_handler_acts_on_every_resource():
    for h in llmd_handlers(handlers.build_registry(handlers.OperatorConfig())):
        assert matched(h, A) and matched(h, B) and matched(h, NONE), h.id


def apply(patch: kopf.Patch, body: dict) -> list[str]:
    copy = {"metadata": {"finalizers": list(body["metadata"]["finalizers"])}}
    for fn in patch.fns:
        fn(copy)
    return copy["metadata"].get("finalizers")


def test_an_operator_releases_the_other_kneecap_finalizers_in_its_own_patch():
    a, b = parse_selector("kneecap.io/shard=a"), parse_selector("kneecap.io/shard=b")
    # a shard serving a resource from before the split (and from a shard since gone)
    body = {"metadata": {"finalizers": [UNSHARDED_FINALIZER, a.finalizer, "other.io/keep", b.finalizer]}}
    patch = kopf.Patch()
    assert release_other_finalizers(a.finalizer, body, patch) == sorted([UNSHARDED_FINALIZER, b.finalizer])
    assert all(op["op"] == "remove" and op["path"].startswith("/metadata/finalizers/")
               for op in patch.as_json_patch(body))
    assert apply(patch, body) == [a.finalizer, "other.io/keep"]
    # the unsharded operator after a merge back
    patch = kopf.Patch()
    assert release_other_finalizers(finalizer(None), body, patch) == sorted([a.finalizer, b.finalizer])
    assert apply(patch, body) == [UNSHARDED_FINALIZER, "other.io/keep"]
    # nothing of another operator's: no patch
    patch = kopf.Patch()
    assert release_other_finalizers(a.finalizer, {"metadata": {"finalizers": [a.finalizer, "x.io/kneecap.io"]}},
                                    patch) == [] and not patch
