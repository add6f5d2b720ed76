"""The files the factory reads at run time, and the one way to find them.

They are package data under factory/data/ (compat.json, the measured compiles, the built-in recipes, the
builder images' Dockerfiles in docker/), so a checkout, an editable install and an installed wheel find the
same files in the same place. They are read as real files, not through a zip: Dockerfiles and patches become
build contexts and container inputs. The container tree (factory/container/) is found by its own package,
which is mounted into the builders as it is.
"""

from __future__ import annotations

from pathlib import Path

DATA_DIR = Path(__file__).resolve().parents[1] / "data"


def data_path(*parts: str) -> Path:
    """factory/data/<parts>: the path of a file the factory ships, whether or not it exists."""
    return DATA_DIR.joinpath(*parts)


def read_data(*parts: str) -> str:
    """The text of a file the factory ships (UTF-8)."""
    return data_path(*parts).read_text(encoding="utf-8")
