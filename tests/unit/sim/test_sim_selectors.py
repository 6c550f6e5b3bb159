"""Label and field selector parsing and matching (pure)."""

from __future__ import annotations

import pytest

from vllm_operator.sim import selectors

LABELS = {"metadata": {"labels": {"app": "web", "tier": "front", "ver": "2"}}}


@pytest.mark.parametrize(("text", "matches"), [
    ("", True),
    ("app=web", True),
    ("app==web", True),
    ("app=db", False),
    ("app!=db", True),
    ("missing!=x", True),
    ("tier in (front, back)", True),
    ("tier in (back)", False),
    ("tier notin (back)", True),
    ("missing notin (x)", True),
    ("app", True),
    ("!app", False),
    ("!missing", True),
    ("app=web,tier=front,ver in (1,2)", True),
    ("app=web,tier=back", False),
    ("example.com/key=v", False),
], ids=["empty", "eq", "double-eq", "eq-miss", "neq", "neq-absent", "in", "in-miss", "notin", "notin-absent",
        "exists", "not-exists-present", "not-exists-absent", "conjunction", "conjunction-miss", "prefixed-key"])
def test_label_selector_semantics(text: str, matches: bool) -> None:
    assert selectors.labels_match(selectors.parse_label_selector(text), LABELS) is matches


@pytest.mark.parametrize("text", ["app in web", "app in ()", "a b", "bad key!=x", "app=" + "x" * 64, "=v"],
                         ids=["in-without-parens", "empty-set", "space", "space-in-key", "value-too-long",
                              "no-key"])
def test_malformed_label_selectors_are_refused(text: str) -> None:
    with pytest.raises(selectors.SelectorError):
        selectors.parse_label_selector(text)


def test_field_selector_checks_allowed_fields_and_renders_values() -> None:
    obj = {"metadata": {"name": "p"}, "spec": {"nodeName": "n1", "hostNetwork": True}}
    allowed = {"metadata.name", "spec.nodeName", "spec.hostNetwork", "status.phase"}.__contains__
    parsed = selectors.parse_field_selector("metadata.name=p,spec.hostNetwork=true,status.phase=", allowed)
    assert selectors.fields_match(parsed, obj)
    assert not selectors.fields_match(selectors.parse_field_selector("spec.nodeName!=n1", allowed), obj)
    with pytest.raises(selectors.SelectorError, match=r"field label not supported: data\.x"):
        selectors.parse_field_selector("data.x=1", allowed)
