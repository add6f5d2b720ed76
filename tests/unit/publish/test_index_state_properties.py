"""The index state readers fed arbitrary bytes and JSON: they return what the pages can be rendered from, or
raise DamagedState (one line, the project's error), never anything else."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factory.core.errors import FactoryError
from factory.publish import humanpage, index

# Text with lone surrogates too: a JSON "\\ud800" reads back as a string no page can be encoded with.
TEXT = st.text(st.characters(codec=None), max_size=20)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
FILENAME = "demo_ext-0.1.0+cu13.0.torch2.14.abi1.sm80.90-py3-none-any.whl"
# Objects shaped like each state file, with arbitrary values where the real ones go: the readers' checks
# of each field get exercised, not only "is it an object".
FILE_ENTRY = st.fixed_dictionaries(
    {},
    optional={
        "filename": st.sampled_from([FILENAME, "x.whl", "notes.txt"]) | JSON,
        "hashes": st.fixed_dictionaries({"sha256": st.sampled_from(["a" * 64, "A" * 64, "0"]) | JSON}) | JSON,
        "size": JSON,
        "upload-time": JSON,
        "requires-python": JSON,
        "core-metadata": st.fixed_dictionaries({"sha256": st.just("b" * 64) | JSON}) | JSON,
    },
)
SHAPED = {
    "project": st.fixed_dictionaries({"files": st.lists(FILE_ENTRY, max_size=3) | JSON}),
    "root": st.fixed_dictionaries(
        {
            "projects": st.lists(
                st.fixed_dictionaries({"name": st.sampled_from(["demo-ext", "Demo_Ext", ""]) | JSON})
            )
        }
    ),
    "variants": st.fixed_dictionaries(
        {
            "variants": st.lists(
                st.fixed_dictionaries({"id": st.sampled_from(["cu130-x", "../..", "a/b"]) | JSON})
            )
        }
    ),
    "matrix": st.fixed_dictionaries(
        {
            "cells": st.lists(
                st.fixed_dictionaries(
                    {k: st.text(max_size=8) | JSON for k in ("project", "variant_id", "python")},
                    optional={
                        "status": st.sampled_from(["built", "failed", "not built", "ok"]) | JSON,
                        "detail": JSON,
                    },
                )
            )
        }
    ),
}


# Each reader, then what publishing does with what it read: render the pages and encode them for the store.


def _project(data: bytes) -> None:
    recs = index.records_from_project_json(data)
    index.project_html("demo-ext", recs, variant_id="v").encode()
    index.project_json("demo-ext", recs, variant_id="v").encode()
    index.merge_records(recs, [])


def _root(data: bytes) -> None:
    names = index.projects_from_root_json(data)
    index.variant_root_html(names).encode()
    index.variant_root_json(names).encode()


def _variants(data: bytes) -> None:
    ids = index.variant_ids_from_top_root_json(data)
    index.top_root_html(ids).encode()
    index.top_root_json(ids).encode()


def _matrix(data: bytes) -> None:
    cells = index.cells_from_json(data)
    humanpage.human_page(cells).encode()
    index.cells_to_json(cells).encode()


READERS: dict[str, Callable[[bytes], None]] = {
    "project": _project,
    "root": _root,
    "variants": _variants,
    "matrix": _matrix,
}


def _only_damaged_state(read: Callable[[bytes], None], data: bytes) -> None:
    try:
        read(data)
    except index.RecordConflict:
        pass  # a page listing two spellings of a release reads fine; merging into it is what refuses
    except index.DamagedState as exc:
        assert isinstance(exc, FactoryError) and "\n" not in str(exc)


SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("kind", list(READERS))
@SETTINGS
@given(data=st.binary(max_size=200))
def test_arbitrary_bytes(kind: str, data: bytes) -> None:
    _only_damaged_state(READERS[kind], data)


@pytest.mark.parametrize("kind", list(READERS))
@SETTINGS
@given(doc=JSON)
def test_arbitrary_json(kind: str, doc: object) -> None:
    _only_damaged_state(READERS[kind], json.dumps(doc).encode())


@pytest.mark.parametrize("kind", list(READERS))
@SETTINGS
@given(data=st.data())
def test_json_shaped_like_the_state(kind: str, data: st.DataObject) -> None:
    _only_damaged_state(READERS[kind], json.dumps(data.draw(SHAPED[kind])).encode())


@pytest.mark.parametrize(
    ("read", "text", "why"),
    [
        (index.records_from_project_json, b"\x00garbage{", "not UTF-8 text"),
        (index.records_from_project_json, b"", "not JSON"),
        (index.variant_ids_from_top_root_json, b"[1, 2]", "a JSON list, not a list of variant indexes"),
        (index.projects_from_root_json, b'{"projects": [{"name": "../x"}]}', "not a normalised project name"),
        (index.cells_from_json, b'{"cells": [{"project": 1}]}', '"project" is 1, not a string'),
        (index.records_from_project_json, b"[" * 100_000, "nested too deep|not JSON"),
        (index.cells_from_json, b'{"cells": [{"project": "\\ud800"}]}', "not Unicode text"),
    ],
)
def test_damage_is_said_plainly(read: Callable[[bytes], object], text: bytes, why: str) -> None:
    with pytest.raises(index.DamagedState, match=why):
        read(text)
