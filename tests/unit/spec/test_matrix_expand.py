"""GitHub Actions include/exclude rules, from the examples in "Using a matrix for your jobs"."""

from __future__ import annotations

from factory.spec.matrix import expand, expand_with_origin


def test_cross_product_in_written_order() -> None:
    # GitHub: {version: [10, 12, 14], os: [ubuntu, windows]} runs version-major order.
    jobs = expand({"torch": ["2.9", "2.10", "2.11"], "cuda": ["12.8", "13.0"]})
    assert jobs == [
        {"torch": "2.9", "cuda": "12.8"},
        {"torch": "2.9", "cuda": "13.0"},
        {"torch": "2.10", "cuda": "12.8"},
        {"torch": "2.10", "cuda": "13.0"},
        {"torch": "2.11", "cuda": "12.8"},
        {"torch": "2.11", "cuda": "13.0"},
    ]


def test_githubs_fruit_and_animal_example_verbatim() -> None:
    jobs = expand(
        {"fruit": ["apple", "pear"], "animal": ["cat", "dog"]},
        include=[
            {"color": "green"},
            {"color": "pink", "animal": "cat"},
            {"fruit": "apple", "shape": "circle"},
            {"fruit": "banana"},
            {"fruit": "banana", "animal": "cat"},
        ],
    )
    assert jobs == [
        {"fruit": "apple", "animal": "cat", "color": "pink", "shape": "circle"},
        {"fruit": "apple", "animal": "dog", "color": "green", "shape": "circle"},
        {"fruit": "pear", "animal": "cat", "color": "pink"},
        {"fruit": "pear", "animal": "dog", "color": "green"},
        {"fruit": "banana"},
        {"fruit": "banana", "animal": "cat"},
    ]


def test_fruit_example_on_our_axes() -> None:
    # fruit -> cuda, animal -> python, color -> env, shape -> a free extra key.
    jobs = expand(
        {"cuda": ["12.8", "13.0"], "python": ["3.10", "3.11"]},
        include=[
            {"env": {"A": "green"}},
            {"env": {"A": "pink"}, "python": "3.10"},
            {"cuda": "12.8", "runner": "big"},
            {"cuda": "12.9"},
            {"cuda": "12.9", "python": "3.10"},
        ],
    )
    assert jobs == [
        {"cuda": "12.8", "python": "3.10", "env": {"A": "pink"}, "runner": "big"},
        {"cuda": "12.8", "python": "3.11", "env": {"A": "green"}, "runner": "big"},
        {"cuda": "13.0", "python": "3.10", "env": {"A": "pink"}},
        {"cuda": "13.0", "python": "3.11", "env": {"A": "green"}},
        {"cuda": "12.9"},
        {"cuda": "12.9", "python": "3.10"},
    ]


def test_include_extends_one_matching_combination() -> None:
    # GitHub: os x node, include {os: windows, node: 16, npm: 6} adds npm to that one job only.
    jobs = expand(
        {"cuda": ["12.8", "13.0"], "torch": ["2.9", "2.10"]},
        include=[{"cuda": "13.0", "torch": "2.10", "env": {"NVCC_THREADS": "1"}}],
    )
    assert len(jobs) == 4
    assert [j.get("env") for j in jobs] == [None, None, None, {"NVCC_THREADS": "1"}]


def test_include_that_overwrites_an_original_value_adds_a_new_job() -> None:
    # GitHub: include {os: windows-latest, version: 17} adds a job, it never rewrites version 16.
    jobs = expand(
        {"cuda": ["12.8", "13.0"], "torch": ["2.9", "2.10"]}, include=[{"cuda": "13.0", "torch": "2.14"}]
    )
    assert len(jobs) == 5
    assert jobs[-1] == {"cuda": "13.0", "torch": "2.14"}
    assert {"cuda": "13.0", "torch": "2.10"} in jobs


def test_matrix_of_only_includes() -> None:
    jobs = expand({}, include=[{"cuda": "12.8", "torch": "2.9"}, {"cuda": "13.0", "torch": "2.10"}])
    assert jobs == [{"cuda": "12.8", "torch": "2.9"}, {"cuda": "13.0", "torch": "2.10"}]


def test_later_include_may_overwrite_what_an_earlier_include_added() -> None:
    jobs = expand({"cuda": ["13.0"]}, include=[{"runner": "small"}, {"runner": "big"}])
    assert jobs == [{"cuda": "13.0", "runner": "big"}]


def test_include_never_overwrites_original_values_even_when_added_keys_match() -> None:
    jobs = expand({"cuda": ["12.8", "13.0"]}, include=[{"tier": "a"}, {"tier": "a", "cuda": "12.9"}])
    assert jobs == [
        {"cuda": "12.8", "tier": "a"},
        {"cuda": "13.0", "tier": "a"},
        {"tier": "a", "cuda": "12.9"},
    ]


def test_exclude_matches_partially() -> None:
    # GitHub: 2 os x 3 versions x 2 environments = 12; excluding one full triple and one (os, version) pair
    # (which matches 2 jobs) leaves 9.
    jobs = expand(
        {"cuda": ["12.8", "13.0"], "python": ["3.10", "3.11", "3.12"], "cxx11_abi": [True, False]},
        exclude=[
            {"cuda": "12.8", "python": "3.10", "cxx11_abi": False},
            {"cuda": "13.0", "python": "3.12"},
        ],
    )
    assert len(jobs) == 9
    assert {"cuda": "12.8", "python": "3.10", "cxx11_abi": False} not in jobs
    assert {"cuda": "12.8", "python": "3.10", "cxx11_abi": True} in jobs
    assert not any(j["cuda"] == "13.0" and j["python"] == "3.12" for j in jobs)


def test_exclude_on_one_key_removes_every_match() -> None:
    jobs = expand({"cuda": ["12.8", "13.0"], "python": ["3.10", "3.11"]}, exclude=[{"python": "3.10"}])
    assert jobs == [{"cuda": "12.8", "python": "3.11"}, {"cuda": "13.0", "python": "3.11"}]


def test_includes_are_applied_after_excludes_and_can_add_back() -> None:
    jobs = expand(
        {"cuda": ["12.8", "13.0"], "python": ["3.10", "3.11"]},
        exclude=[{"cuda": "12.8"}],
        include=[{"cuda": "12.8", "python": "3.11"}],
    )
    assert jobs == [
        {"cuda": "13.0", "python": "3.10"},
        {"cuda": "13.0", "python": "3.11"},
        {"cuda": "12.8", "python": "3.11"},
    ]


def test_include_does_not_extend_excluded_combinations() -> None:
    jobs = expand(
        {"cuda": ["12.8", "13.0"]}, exclude=[{"cuda": "12.8"}], include=[{"cuda": "12.8", "runner": "big"}]
    )
    assert jobs == [{"cuda": "13.0"}, {"cuda": "12.8", "runner": "big"}]


def test_exclude_everything_gives_no_jobs() -> None:
    assert expand({"cuda": ["12.8"]}, exclude=[{"cuda": "12.8"}]) == []


def test_origin_points_at_the_include_that_created_a_job() -> None:
    result = expand_with_origin({"cuda": ["12.8"]}, include=[{"env": {"A": "1"}}, {"cuda": "13.0"}])
    assert result == [({"cuda": "12.8", "env": {"A": "1"}}, None), ({"cuda": "13.0"}, 1)]


def test_inputs_are_not_mutated() -> None:
    include = [{"tier": "a"}]
    axes = {"cuda": ["12.8"]}
    expand(axes, include=include)
    assert include == [{"tier": "a"}] and axes == {"cuda": ["12.8"]}
