"""The start order of jobs: a variant's Pythons back to back (its later ones after its first has finished),
different variants side by side."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from factory.core.platforms import named
from factory.core.variants import Variant, parse_arch_set
from factory.plan.plan import Job, plan_matrix
from factory.plan.schedule import Schedule, variant_order
from factory.spec.config import load_matrix_file


def variant(arch: str) -> Variant:
    return Variant(
        package="p", version="1", cuda="13.0", torch="2.14", cxx11_abi=True, archs=parse_arch_set(arch)
    )


A, B, C = variant("8.0"), variant("9.0"), variant("12.0")
ROOT = Path(__file__).resolve().parents[3]


def jobs(*pairs: tuple[Variant, str]) -> list[Job]:
    return [Job(variant=v, python=p) for v, p in pairs]


def ids(all_jobs: list[Job], indexes: list[int] | tuple[int, ...]) -> list[str]:
    return [f"{all_jobs[i].variant.archs[0]}/{all_jobs[i].python}" for i in indexes]


def test_variant_order_keeps_a_variants_pythons_together() -> None:
    # A matrix listing Pythons outermost interleaves variants; the order groups them, variants by first sight.
    js = jobs((A, "3.13"), (B, "3.13"), (A, "3.14"), (B, "3.14"), (C, "3.13"))
    assert ids(js, variant_order(js)) == ["8.0/3.13", "8.0/3.14", "9.0/3.13", "9.0/3.14", "12.0/3.13"]
    assert variant_order([]) == []


def test_a_later_python_waits_for_its_variants_first() -> None:
    js = jobs((A, "3.13"), (A, "3.14"), (A, "3.15"))
    s = Schedule(jobs=js)
    # Three slots, but only the lead may start: the others would compile the same objects cold beside it.
    assert s.take(3) == [0]
    assert s.take(3) == []
    s.finish(0)
    assert s.take(3) == [1, 2]  # both now hit what the lead left in the cache
    s.finish(1)
    s.finish(2)
    assert s.waiting == () and s.running == frozenset()


def test_variants_run_side_by_side() -> None:
    js = jobs((A, "3.13"), (A, "3.14"), (B, "3.13"), (B, "3.14"))
    s = Schedule(jobs=js)
    assert ids(js, s.take(2)) == ["8.0/3.13", "9.0/3.13"]
    s.finish(2)
    # B's follower first: it is mostly cache hits and finishes B, which can then be published.
    assert ids(js, s.take(1)) == ["9.0/3.14"]
    s.finish(0)
    assert ids(js, s.take(2)) == ["8.0/3.14"]


def test_followers_start_before_new_leads() -> None:
    js = jobs((A, "3.13"), (A, "3.14"), (B, "3.13"), (C, "3.13"))
    s = Schedule(jobs=js)
    assert ids(js, s.take(1)) == ["8.0/3.13"]
    s.finish(0)
    assert ids(js, s.take(1)) == ["8.0/3.14"]
    assert ids(js, s.take(5)) == ["9.0/3.13", "12.0/3.13"]


def test_one_slot_runs_each_variant_back_to_back() -> None:
    js = jobs((A, "3.13"), (B, "3.13"), (A, "3.14"), (B, "3.14"))
    s = Schedule(jobs=js)
    started = []
    while s.waiting:
        (index,) = s.take(1)
        started.append(index)
        s.finish(index)
    assert ids(js, started) == ["8.0/3.13", "8.0/3.14", "9.0/3.13", "9.0/3.14"]


def test_a_variants_other_platform_has_a_lead_of_its_own() -> None:
    # Its compilers are other binaries: nothing of the first platform's compiles is a hit for it, so its
    # first job starts beside the first platform's; its own later Pythons wait for it.
    arm = named("aarch64")
    js = [
        Job(variant=A, python="3.13"),
        Job(variant=A, python="3.14"),
        Job(variant=A, python="3.13", platform=arm),
    ]
    js.append(Job(variant=A, python="3.14", platform=arm))
    assert variant_order(js) == [0, 1, 2, 3]
    s = Schedule(jobs=js)
    assert s.take(4) == [0, 2]
    s.finish(2)
    assert s.take(4) == [3]
    s.finish(0)
    assert s.take(4) == [1]


def test_a_failed_lead_still_lets_its_followers_start() -> None:
    # The schedule knows no results: a failed lead leaves what it compiled; --keep-going decides the rest.
    js = jobs((A, "3.13"), (A, "3.14"))
    s = Schedule(jobs=js)
    assert s.take(2) == [0]
    s.finish(0)
    assert s.take(2) == [1]


def test_finish_of_a_job_not_running_is_an_error() -> None:
    s = Schedule(jobs=jobs((A, "3.13")))
    with pytest.raises(ValueError, match="not running"):
        s.finish(0)
    s.take(1)
    s.finish(0)
    with pytest.raises(ValueError, match="not running"):
        s.finish(0)


@pytest.mark.parametrize("seed", range(30))
def test_random_runs_start_every_job_once_and_never_stall(seed: int) -> None:
    """Whatever the matrix, slot count and finishing order: every job starts exactly once, a follower only
    after its lead finished, at most `slots` run at once, and something can start whenever nothing runs."""
    rng = random.Random(seed)
    variants = [variant(a) for a in ("8.0", "9.0", "10.0", "12.0")[: rng.randint(1, 4)]]
    pythons = ["3.13", "3.14", "3.15"][: rng.randint(1, 3)]
    js = [Job(variant=v, python=p) for v in variants for p in pythons]
    rng.shuffle(js)
    slots = rng.randint(1, 4)
    s = Schedule(jobs=js)
    lead = {}
    for index in variant_order(js):
        lead.setdefault(js[index].variant, index)
    started: list[int] = []
    finished: set[int] = set()
    while s.waiting or s.running:
        new = s.take(slots - len(s.running))
        for index in new:
            assert index == lead[js[index].variant] or lead[js[index].variant] in finished
        started += new
        assert len(s.running) <= slots
        assert s.running, "nothing runs and nothing may start: the schedule stalled"
        done = rng.choice(sorted(s.running))
        s.finish(done)
        finished.add(done)
    assert sorted(started) == list(range(len(js)))


def test_a_runs_pythons_of_one_toolchain_make_their_image_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """build.Runner makes each builder image once per run: 3.13 and 3.14 share forky's, 3.11 has its own."""
    from factory.build import images
    from factory.build import runner as build
    from factory.spec import toolchains

    made: list[str] = []

    def ensure(client: object, *, cuda: str, python: str, **_kw: object) -> str:
        name = toolchains.builder_image_for(cuda=cuda, python=python, flavor="pypi", base_image=None)
        made.append(name)
        return name

    monkeypatch.setattr(images, "ensure_builder_image", ensure)
    mf = load_matrix_file(ROOT / "examples" / "demo-pythons.yaml")
    runner = build.Runner(None, mf, build.BuildSettings(output=tmp_path, run_id="r1"))
    got = {p: runner.image(Job(variant=A, python=p)) for p in ("3.13", "3.14", "3.11", "3.13")}
    assert got == {
        "3.13": "factory-builder:cu13.0-forky-pypi",
        "3.14": "factory-builder:cu13.0-forky-pypi",
        "3.11": "factory-builder:cu13.0-py3.11-pypi",
    }
    assert made == ["factory-builder:cu13.0-forky-pypi", "factory-builder:cu13.0-py3.11-pypi"]


def test_the_two_python_demo_plans_one_variant_of_two_jobs() -> None:
    plan = plan_matrix(load_matrix_file(ROOT / "examples" / "demo-pythons.yaml"))
    assert [j.python for j in plan.jobs] == ["3.13", "3.14"]
    assert len(plan.variants) == 1
    s = Schedule(jobs=plan.jobs)
    assert s.take(2) == [0]  # 3.14 waits for 3.13's compiles
