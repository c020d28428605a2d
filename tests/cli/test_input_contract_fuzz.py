"""Issue 24: property-based fuzzing of the JSON loaders (trace, topology, plan, and the document parser): any
input either loads or raises InputError (exit 2), never anything else. Needs `hypothesis` (the dev extra);
skipped without it."""

from __future__ import annotations

import copy
import json
import math

import pytest

from tests.conftest import REPO
from mlopt.errors import InputError

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
VALUES = st.recursive(SCALARS, lambda children: st.one_of(st.lists(children, max_size=4),
                                                          st.dictionaries(st.text(max_size=6), children, max_size=4)),
                      max_leaves=12)


def _mutated(doc, data):
    """doc with one value somewhere replaced by a fuzzed one (or a key removed)."""
    doc = copy.deepcopy(doc)
    node = doc
    for _ in range(data.draw(st.integers(min_value=0, max_value=5))):
        children = [(k, v) for k, v in (node.items() if isinstance(node, dict) else enumerate(node))
                    if isinstance(v, (dict, list)) and v]
        if not children:
            break
        _, node = data.draw(st.sampled_from(children))
    keys = list(node) if isinstance(node, dict) else list(range(len(node)))
    if keys:
        key = data.draw(st.sampled_from(keys))
        if isinstance(node, dict) and data.draw(st.booleans()):
            del node[key]
        else:
            node[key] = data.draw(VALUES)
    return doc


def _all_finite(value) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(_all_finite(v) for v in value)
    return True


def _loads_or_refuses(load, text: str, name: str) -> None:
    """The contract: the loader returns or raises InputError; and what it accepts has no NaN or infinity."""
    try:
        load(text, name)
    except InputError:
        return
    assert _all_finite(json.loads(text)), "a non-finite number was accepted"


def _fuzz_loader(kind: str):
    from mlopt.formats.io import parse_document
    from mlopt.formats.plan import plan_from_dict
    from mlopt.formats.topology import Topology
    from mlopt.formats.trace import ModelTrace

    load = {"trace": ModelTrace.from_dict, "topology": Topology.from_dict, "plan": plan_from_dict}[kind]
    return lambda text, name: load(parse_document(text, name), name)


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                        HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=st.data())
def test_fuzzed_traces_load_or_raise_input_error(data):
    from tests.formats.test_formats import small_trace

    doc = _mutated(small_trace().to_dict(), data)
    _loads_or_refuses(_fuzz_loader("trace"), json.dumps(doc, allow_nan=True), "fuzz.json")


@FUZZ
@given(data=st.data())
def test_fuzzed_topologies_load_or_raise_input_error(data):
    from mlopt.formats.topology import from_spec

    doc = _mutated(from_spec("ndv2x2").to_dict(), data)
    _loads_or_refuses(_fuzz_loader("topology"), json.dumps(doc, allow_nan=True), "fuzz.json")


@FUZZ
@given(data=st.data())
def test_fuzzed_plans_load_or_raise_input_error(data):
    plan = json.loads((REPO / "examples" / "ci" / "plans" / "ddp_mlp" / "memory.plan.json").read_text())
    doc = _mutated(plan, data)
    _loads_or_refuses(_fuzz_loader("plan"), json.dumps(doc, allow_nan=True), "fuzz.json")


NESTED = st.integers(min_value=0, max_value=5000).map(lambda n: "[" * n + "]" * n)
LONG_NUMBERS = st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n)


@FUZZ
@given(text=st.one_of(st.text(max_size=200), NESTED, LONG_NUMBERS))
def test_fuzzed_text_parses_or_raises_input_error(text):
    from mlopt.formats.io import parse_document

    for name in ("fuzz.json", "fuzz.yaml"):
        try:
            parse_document(text, name)
        except InputError:
            pass
