"""factory.spec.measured: interpolation between measured points."""

from __future__ import annotations

import pytest

from factory.spec.measured import interpolate

POINTS = [(128, 4.0), (32, 2.0), (256, 6.0)]  # unordered on purpose


@pytest.mark.parametrize(
    ("x", "expected"),
    [(32, 2.0), (80, 3.0), (128, 4.0), (192, 5.0), (16, 2.0), (512, 6.0)],
)
def test_linear_between_points_and_nearest_beyond(x: int, expected: float) -> None:
    assert interpolate(POINTS, x) == pytest.approx(expected)
