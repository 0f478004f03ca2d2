"""Hypothesis strategies for what a pod author or a client may send: the fuzz suites of both services draw here."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

# Numbers as text, as annotations and resource values carry them: ordinary, at the bounds, and hostile.
NUMBER_TEXT = st.one_of(
    st.integers(-5, 3000).map(str),
    st.builds(
        "{}{}".format,
        st.integers(0, 5000),
        st.sampled_from(["", "m", "k", "M", "G", "E", "Ki", "Mi", "Gi", "Ei", "e3", "e-3", "n"]),
    ),
    st.builds("{}e{}".format, st.sampled_from(["1", "9.99", "-1", ".5", "0"]), st.integers(-(10**9), 10**9)),
    st.integers(1, 5000).map(lambda digits: "9" * digits),
    st.decimals(allow_nan=True, allow_infinity=True).map(str),
    st.floats().map(str),
    st.sampled_from(
        [
            "1e999999",
            "1e300000",
            "1e-999999999",
            "NaN",
            "-Infinity",
            "0x10",
            "1_000",
            "٣",
            "²",
            "1E",
            "1e",
            "2k",
            "1e28",
            "0.00009",
            "0.0001",
            "1000",
            "1001",
            " 1 ",
            "",
            "+1",
            "--1",
            "1.",
            ".1",
        ]
    ),
    st.text(max_size=12),
)

JSON_LEAVES = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)

# JSON number literals as they would appear in a body: long, huge, tiny, not finite.
NUMBER_LITERALS = st.one_of(
    st.integers(-(10**40), 10**40).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(1, 1000).map(lambda digits: "9" * digits),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", "-0", "0.0", "1e-400", "4611686018427387904", "1e308"]),
)


def json_text(value: Any) -> str:
    return json.dumps(value, allow_nan=False)


@st.composite
def json_objects(draw: st.DrawFn, fields: dict[str, st.SearchStrategy[str]], extra_keys: st.SearchStrategy[str]) -> str:
    """A JSON object's text: some of `fields` (each value a strategy of JSON texts), now and then a key twice or one
    unknown, in any order."""
    chosen = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, min_size=0, max_size=len(fields)))
    pairs = [(key, draw(fields[key])) for key in chosen]
    if draw(st.integers(0, 9)) == 0 and pairs:
        pairs.append((pairs[0][0], draw(fields[pairs[0][0]])))  # a key twice
    if draw(st.integers(0, 9)) == 0:
        pairs.append((draw(extra_keys), draw(JSON_VALUES.map(json_text))))
    pairs = draw(st.permutations(pairs))
    return "{" + ", ".join(f"{json_text(key)}: {literal}" for key, literal in pairs) + "}"
