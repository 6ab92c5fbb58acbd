"""The fast canonical encoder gives the canonical bytes wherever it is used (docs/adr/0022)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from domain.audit import canonical_json
from interfaces.store.chain import FloatSpotter, sorted_json

# JSON without floats, with the text that is hardest to escape alike: controls, quotes,
# backslashes, U+2028, non-BMP characters, keys that sort differently by bytes and by code point.
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=20)
scalars = st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1) | text
float_free = st.recursive(scalars, lambda inner: st.lists(inner, max_size=5) | st.dictionaries(text, inner, max_size=5),
                          max_leaves=30)


@settings(max_examples=400, deadline=None)
@given(float_free)
def test_msgspec_sorted_gives_the_canonical_bytes_for_any_value_without_floats(value):
    assert sorted_json(value) == canonical_json(value)


@settings(max_examples=200, deadline=None)
@given(st.recursive(scalars | st.floats(allow_nan=False, allow_infinity=False),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
                    max_leaves=20))
def test_a_value_is_known_to_hold_a_float_when_decoded(value):
    decoded, floats = FloatSpotter().decode(json.dumps(value))
    assert decoded == value
    assert floats == _has_float(value)


def _has_float(value) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, list):
        return any(_has_float(v) for v in value)
    if isinstance(value, dict):
        return any(_has_float(v) for v in value.values())
    return False


def test_the_two_differ_on_floats_which_is_why_floats_take_json_dumps():
    assert sorted_json(1e16) != canonical_json(1e16) == b"1e+16"
