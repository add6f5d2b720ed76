"""Shipping learned compile profiles through the index store: merge both ways, conditional writes."""

from __future__ import annotations

from pathlib import Path

from factory.container.protocol import Measurement
from factory.memory import profiles, shipping
from factory.publish.stores import LocalStore


def learn(home: Path, key: str, peak: int) -> None:
    path = profiles.profile_path("flash-attn", "2.8.3", home=home)
    base = profiles.load_profile(path, package="flash-attn", version="2.8.3")
    profiles.save_profile(profiles.merge(base, [Measurement(key=key, peak_bytes=peak, wall_s=10.0)]), path)


def entries(home: Path) -> dict[str, int]:
    prof = profiles.load_profile(profiles.profile_path("flash-attn", "2.8.3", home=home))
    return {k: e.peak_bytes for k, e in prof.entries.items()}


def test_runners_share_what_each_learned(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "index")
    runner_a, runner_b, runner_c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    learn(runner_a, "fwd.cu|8.0|1", 3 << 30)
    learn(runner_b, "bwd.cu|8.0|1", 6 << 30)
    learn(runner_b, "fwd.cu|8.0|1", 4 << 30)  # b saw the same file peak higher: peaks only rise
    assert shipping.push_profile(store, package="flash-attn", version="2.8.3", home=runner_a) == 1
    assert shipping.push_profile(store, package="flash-attn", version="2.8.3", home=runner_b) == 2
    assert shipping.pull_profile(store, package="flash-attn", version="2.8.3", home=runner_c) == 2
    assert entries(runner_c) == {"fwd.cu|8.0|1": 4 << 30, "bwd.cu|8.0|1": 6 << 30}
    key = shipping.profile_key("Flash_Attn", "2.8.3")
    assert key == "profiles/flash-attn-2.8.3.compile-profile.json"
    assert (tmp_path / "index" / key).is_file()


def test_nothing_to_ship_or_fetch(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "index")
    assert shipping.push_profile(store, package="x", version="1", home=tmp_path / "h") == 0
    assert shipping.pull_profile(store, package="x", version="1", home=tmp_path / "h") == 0
    assert not (tmp_path / "index").exists() or not any((tmp_path / "index").rglob("*.json"))


def test_a_concurrent_push_is_merged_not_lost(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    store = LocalStore(tmp_path / "index")
    other, mine = tmp_path / "other", tmp_path / "mine"
    learn(other, "a.cu|8.0|1", 1 << 30)
    learn(mine, "b.cu|8.0|1", 2 << 30)
    real_get = store.get
    raced = []

    def get_then_race(key: str):  # type: ignore[no-untyped-def]
        blob = real_get(key)
        if not raced:  # another runner ships between our read and our conditional write
            raced.append(True)
            shipping.push_profile(store, package="flash-attn", version="2.8.3", home=other)
        return blob

    monkeypatch.setattr(store, "get", get_then_race)
    assert shipping.push_profile(store, package="flash-attn", version="2.8.3", home=mine) == 2
    monkeypatch.setattr(store, "get", real_get)
    assert shipping.pull_profile(store, package="flash-attn", version="2.8.3", home=tmp_path / "fresh") == 2
