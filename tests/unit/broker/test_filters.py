"""Trigger filters: each dialect's semantics, compile errors with reasons and paths, compile-once caching."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_eventing.broker.filters import (
    REASON_CESQL,
    REASON_INVALID,
    REASON_MULTIPLE_DIALECTS,
    REASON_UNKNOWN_DIALECT,
    FilterError,
    TriggerFilters,
    compile_attributes,
    compile_filter,
    compile_filters,
    compile_trigger,
)

EVENT: dict[str, object] = {
    "specversion": "1.0", "id": "e-1", "source": "https://example.com/orders", "type": "com.example.order.created",
    "datacontenttype": "application/json; charset=utf-8", "region": "eu-west", "priority": 3, "urgent": True,
}

# -- strategies ----------------------------------------------------------------------------------------------
names = st.sampled_from(["type", "source", "subject", "region", "priority", "urgent", "tier"])
values = st.sampled_from(["a", "ab", "b", "com.example", "com.example.x", "1", "true"])
leaf_filters = st.one_of(
    st.builds(lambda n, v: {"cesql": f"{n} = '{v}'"}, names, values),
    st.builds(lambda n, v: {"exact": {n: v}}, names, values),
    st.builds(lambda n, v: {"prefix": {n: v}}, names, values),
    st.builds(lambda n, v: {"suffix": {n: v}}, names, values),
)
filters = st.recursive(leaf_filters, lambda inner: st.one_of(
    st.builds(lambda fs: {"all": fs}, st.lists(inner, min_size=1, max_size=3)),
    st.builds(lambda fs: {"any": fs}, st.lists(inner, min_size=1, max_size=3)),
    st.builds(lambda f: {"not": f}, inner),
), max_leaves=8)
events = st.dictionaries(
    names, st.one_of(values, st.integers(-3, 3), st.booleans()), max_size=5,
).map(lambda ext: {"specversion": "1.0", "id": "x", "source": "s", "type": "t", **ext})


# -- attributes ----------------------------------------------------------------------------------------------
def test_attributes_exact_match_on_every_listed_attribute() -> None:
    f = compile_attributes({"type": "com.example.order.created", "region": "eu-west"})
    assert f.matches(EVENT)
    assert not f.matches({**EVENT, "region": "us-east"})
    assert not f.matches({k: v for k, v in EVENT.items() if k != "region"})


def test_attributes_empty_value_means_any_non_empty_value() -> None:
    f = compile_attributes({"region": "", "type": ""})
    assert f.matches(EVENT)
    assert not f.matches({k: v for k, v in EVENT.items() if k != "region"})  # absent extension
    assert not compile_attributes({"subject": ""}).matches(EVENT)  # an unset optional attribute is ""
    assert compile_attributes({"subject": ""}).matches({**EVENT, "subject": "s"})


def test_attributes_compare_the_canonical_string_of_non_string_values() -> None:
    assert compile_attributes({"priority": "3", "urgent": "true"}).matches(EVENT)
    assert not compile_attributes({"urgent": "True"}).matches(EVENT)


def test_no_filter_matches_everything() -> None:
    for spec in ({}, {"filter": {}}, {"filter": {"attributes": {}}}, {"filters": []}):
        assert compile_trigger(spec).matches(EVENT), spec


# -- subscriptions API dialects --------------------------------------------------------------------------
@pytest.mark.parametrize(("entry", "expected"), [
    ({"exact": {"type": "com.example.order.created"}}, True),
    ({"exact": {"type": "com.example.order"}}, False),
    ({"exact": {"priority": "3"}}, True),
    ({"exact": {"missing": "x"}}, False),
    ({"prefix": {"type": "com.example."}}, True),
    ({"prefix": {"source": "http://"}}, False),
    ({"suffix": {"type": ".created"}}, True),
    ({"suffix": {"type": ".deleted"}}, False),
    ({"suffix": {"missing": "x"}}, False),
    ({"exact": {"datamediatype": "application/json"}}, True),
    ({"all": [{"prefix": {"type": "com."}}, {"exact": {"region": "eu-west"}}]}, True),
    ({"all": [{"prefix": {"type": "com."}}, {"exact": {"region": "us-east"}}]}, False),
    ({"any": [{"exact": {"region": "us-east"}}, {"suffix": {"type": "created"}}]}, True),
    ({"any": [{"exact": {"region": "us-east"}}, {"suffix": {"type": "deleted"}}]}, False),
    ({"not": {"exact": {"region": "us-east"}}}, True),
    ({"not": {"not": {"exact": {"region": "us-east"}}}}, False),
    ({"cesql": "type LIKE 'com.example.%' AND priority > 2"}, True),
    ({"cesql": "urgent AND region = 'us-east'"}, False),
    ({"cesql": "missing = 'x'"}, False),  # an error (missing attribute) is not a match
    ({"not": {"cesql": "missing = 'x'"}}, True),
    ({"any": [{"cesql": "priority = 1"}, {"exact": {"urgent": "true"}}]}, True),
])
def test_dialects(entry: dict[str, Any], expected: bool) -> None:
    assert compile_filter(entry, "f").matches(EVENT) is expected


def test_filters_are_and_ed_and_win_over_filter() -> None:
    spec = {"filter": {"attributes": {"type": "nope"}},
            "filters": [{"prefix": {"type": "com."}}, {"exact": {"region": "eu-west"}}]}
    assert compile_trigger(spec).matches(EVENT)
    spec["filters"].append({"exact": {"urgent": "false"}})
    assert not compile_trigger(spec).matches(EVENT)
    # An empty filters list does not override filter.
    assert not compile_trigger({"filter": {"attributes": {"type": "nope"}}, "filters": []}).matches(EVENT)


# -- compile errors ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("spec", "reason", "path"), [
    ({"filters": [{"regex": {"type": "a.*"}}]}, REASON_UNKNOWN_DIALECT, "spec.filters[0]"),
    ({"filters": [{"exact": {"type": "a"}, "prefix": {"type": "a"}}]}, REASON_MULTIPLE_DIALECTS, "spec.filters[0]"),
    ({"filters": [{}]}, REASON_INVALID, "spec.filters[0]"),
    ({"filters": [{"exact": {"type": ""}}]}, REASON_INVALID, "spec.filters[0].exact.type"),
    ({"filters": [{"prefix": {}}]}, REASON_INVALID, "spec.filters[0].prefix"),
    ({"filters": [{"exact": {"Type": "a"}}]}, REASON_INVALID, "spec.filters[0].exact.Type"),
    ({"filters": [{"exact": {"type": 3}}]}, REASON_INVALID, "spec.filters[0].exact.type"),
    ({"filters": [{"any": []}]}, REASON_INVALID, "spec.filters[0].any"),
    ({"filters": [{"all": {"exact": {"type": "a"}}}]}, REASON_INVALID, "spec.filters[0].all"),
    ({"filters": [{"not": {"any": [{"exact": {"a": "1"}}, {"bogus": 1}]}}]}, REASON_UNKNOWN_DIALECT,
     "spec.filters[0].not.any[1]"),
    ({"filters": ["type=a"]}, REASON_INVALID, "spec.filters[0]"),
    ({"filters": {"exact": {"type": "a"}}}, REASON_INVALID, "spec.filters"),
    ({"filter": {"attributes": {"my-ext": "a"}}}, REASON_INVALID, "spec.filter.attributes.my-ext"),
    ({"filter": {"attributes": ["type"]}}, REASON_INVALID, "spec.filter.attributes"),
    ({"filters": [{"cesql": "type = "}]}, REASON_CESQL, "spec.filters[0].cesql"),
    ({"filters": [{"all": [{"cesql": ""}]}]}, REASON_CESQL, "spec.filters[0].all[0].cesql"),
    ({"filters": [{"cesql": 42}]}, REASON_CESQL, "spec.filters[0].cesql"),
])
def test_invalid_filters_name_reason_and_path(spec: dict[str, Any], reason: str, path: str) -> None:
    with pytest.raises(FilterError) as info:
        compile_trigger(spec)
    assert info.value.reason == reason
    assert info.value.path == path
    assert str(info.value).startswith(f"{path}: ")


# -- properties ----------------------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(filters, events)
def test_not_inverts(entry: dict[str, Any], event: dict[str, object]) -> None:
    assert compile_filter({"not": entry}, "f").matches(event) is not compile_filter(entry, "f").matches(event)


@settings(max_examples=300, deadline=None)
@given(filters, events)
def test_all_and_any_of_one_are_that_one(entry: dict[str, Any], event: dict[str, object]) -> None:
    one = compile_filter(entry, "f").matches(event)
    assert compile_filter({"all": [entry]}, "f").matches(event) is one
    assert compile_filter({"any": [entry]}, "f").matches(event) is one


@settings(max_examples=300, deadline=None)
@given(st.lists(filters, min_size=1, max_size=4), events)
def test_all_is_conjunction_any_is_disjunction(entries: list[dict[str, Any]], event: dict[str, object]) -> None:
    each = [compile_filter(e, "f").matches(event) for e in entries]
    assert compile_filter({"all": entries}, "f").matches(event) is all(each)
    assert compile_filter({"any": entries}, "f").matches(event) is any(each)
    assert compile_filters(entries).matches(event) is all(each)


@settings(max_examples=300, deadline=None)
@given(names, values, events)
def test_exact_implies_prefix_and_suffix(name: str, value: str, event: dict[str, object]) -> None:
    if compile_filter({"exact": {name: value}}, "f").matches(event):
        assert compile_filter({"prefix": {name: value}}, "f").matches(event)
        assert compile_filter({"suffix": {name: value}}, "f").matches(event)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(names, values, max_size=3), events)
def test_legacy_attributes_equal_exact_filters_for_non_empty_values(attrs: dict[str, str],
                                                                    event: dict[str, object]) -> None:
    legacy = compile_trigger({"filter": {"attributes": attrs}}).matches(event)
    modern = compile_trigger({"filters": [{"exact": {k: v}} for k, v in attrs.items()]}).matches(event)
    assert legacy is modern


# -- compile once --------------------------------------------------------------------------------------------
def test_trigger_filters_compile_once_per_filter_change() -> None:
    cache = TriggerFilters()
    spec: dict[str, Any] = {"broker": "b", "filters": [{"exact": {"type": "com.example.order.created"}}]}
    first = cache.get(("ns", "t"), spec)
    for _ in range(100):
        assert cache.get(("ns", "t"), spec).matches(EVENT)
    assert cache.compiles == 1
    assert cache.get(("ns", "t"), {**spec, "subscriber": {"uri": "http://x"}}) is first  # not a filter change
    assert cache.compiles == 1
    changed = {**spec, "filters": [{"exact": {"type": "other"}}]}
    assert not cache.get(("ns", "t"), changed).matches(EVENT)
    assert cache.compiles == 2


def test_trigger_filters_cache_the_error_of_a_bad_spec() -> None:
    cache = TriggerFilters()
    bad = {"filters": [{"regex": {"type": "x"}}]}
    for _ in range(3):
        with pytest.raises(FilterError, match="unknown filter dialect 'regex'"):
            cache.get("t", bad)
    assert cache.compiles == 1
    cache.forget("t")
    assert cache.get("t", {}).matches(EVENT)
    assert cache.compiles == 2


@settings(max_examples=300, deadline=None)
@given(names, values, events)
def test_cesql_equality_on_strings_agrees_with_exact(name: str, value: str, event: dict[str, object]) -> None:
    # CESQL compares a string attribute as a string; an absent one is an error, hence no match, as exact.
    if isinstance(event.get(name, ""), str):
        exact = compile_filter({"exact": {name: value}}, "f").matches(event)
        assert compile_filter({"cesql": f"{name} = '{value}'"}, "f").matches(event) is exact
