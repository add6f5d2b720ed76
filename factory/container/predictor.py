"""Predictions of a build's compiles: the learned profile, and the build's own compiles as they finish."""

from __future__ import annotations

import json
import os
from typing import Any

from . import admission, protocol
from .environ import log


def read_profile(path: str | None, inline: str | None = None) -> dict[str, dict[str, Any]]:
    """The learned profile's entries (FACTORY_PROFILE_IN, or inline FACTORY_PROFILE_JSON), as
    `admission.predict_from` reads them; one that cannot be read is said, and the compile is predicted
    without it (by the recipe's figures), never failed for it."""
    try:
        if inline:
            data = json.loads(inline)
        elif path:
            with open(path) as fh:
                data = json.load(fh)
        else:
            return {}
        _, _, entries = protocol.parse_profile(data)
    except (OSError, ValueError) as exc:
        log(f"cannot read the learned profile ({path or 'inline'}): {exc}; predicting without it")
        return {}
    return {key: protocol.entry_json(e) for key, e in entries.items()}


def read_measurements(path: str | None) -> dict[str, dict[str, Any]]:
    """This build's successful compiles so far (FACTORY_PROFILE_OUT), as profile entries."""
    if not path:
        return {}
    try:
        with open(path) as fh:
            lines = fh.readlines()
    except OSError:
        return {}
    found: dict[str, dict[str, Any]] = {}
    for m in filter(None, map(protocol.parse_measurement, lines)):
        if m.rc == 0 and m.wall_s and m.learns:
            entry = protocol.ProfileEntry(
                peak_bytes=m.peak_bytes, wall_s=m.wall_s, samples=1, envelope=m.envelope, rise=m.rise
            )
            found[m.key] = protocol.entry_json(entry)
    return found


class Predictor:
    """Predictions of this build's compiles, refreshed as its compiles finish: their measurements
    (FACTORY_PROFILE_OUT) shape the prediction of a file the profile does not know. Every wrapper of a build
    has the same profile and recipe figures, so any of them can predict any compile from its key and
    estimate; a prediction is the same object until a measurement changes it."""

    def __init__(
        self,
        profile: dict[str, dict[str, Any]],
        *,
        after_peak: float | None = None,
        seconds_by_file: tuple[tuple[str, float], ...] = (),
        measurements: str | None = None,
    ) -> None:
        self.profile = profile
        self.entries = profile
        self.known: dict[str, Any] = {"after_peak": after_peak, "seconds_by_file": seconds_by_file}
        self.out = measurements  # FACTORY_PROFILE_OUT
        self.stamp: tuple[int, int] | None = None
        self.cache: dict[tuple[str, int], admission.Prediction] = {}

    def predict(self, key: str, estimate_bytes: int) -> admission.Prediction:
        if key not in self.profile:
            self._refresh()
        found = self.cache.get((key, estimate_bytes))
        if found is None:
            found = admission.predict_from(self.entries, key, estimate_bytes=estimate_bytes, **self.known)
            self.cache[(key, estimate_bytes)] = found
        return found

    def _refresh(self) -> None:
        if not self.out:
            return
        try:
            st = os.stat(self.out)
        except OSError:
            return
        stamp = (st.st_size, st.st_mtime_ns)
        if stamp != self.stamp:
            self.stamp = stamp
            self.entries = {**read_measurements(self.out), **self.profile}
            # what the profile knows does not change with the build's measurements
            self.cache = {k: v for k, v in self.cache.items() if k[0] in self.profile}
