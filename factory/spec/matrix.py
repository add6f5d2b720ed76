"""GitHub Actions `strategy.matrix` expansion, exactly as documented ("Using a matrix for your jobs").

1. The cross product of the axes, in the order the axes and their values were written.
2. Every exclude entry removes the combinations it matches, partially (only the keys it names are compared).
3. Then each include entry, in order: it is added to every *original* combination (one from step 1/2)
   whose original axis values it does not overwrite; values added by an earlier include may be overwritten.
   An include that fits no original combination becomes a combination of its own. Includes are applied
   after excludes, so an include can add back an excluded combination.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence

Combination = dict[str, object]
_ABSENT = object()


def _product(axes: Mapping[str, Sequence[object]]) -> Iterator[Combination]:
    keys = list(axes)
    if not keys:
        return
    for values in itertools.product(*(axes[k] for k in keys)):
        yield dict(zip(keys, values, strict=True))


def _matches(
    combo: Mapping[str, object], pattern: Mapping[str, object], defaults: Mapping[str, object]
) -> bool:
    return all(combo.get(k, defaults.get(k, _ABSENT)) == v for k, v in pattern.items())


def expand_with_origin(
    axes: Mapping[str, Sequence[object]],
    include: Sequence[Mapping[str, object]] = (),
    exclude: Sequence[Mapping[str, object]] = (),
    defaults: Mapping[str, object] | None = None,
) -> list[tuple[Combination, int | None]]:
    """Like `expand`, also giving the index of the include entry that created each combination (or None)."""
    defaults = defaults or {}
    originals = [c for c in _product(axes) if not any(_matches(c, e, defaults) for e in exclude)]
    original_keys = set(axes)
    extended: list[Combination] = [dict(c) for c in originals]
    added: list[tuple[Combination, int]] = []
    for index, entry in enumerate(include):
        fitted = False
        for base, combo in zip(originals, extended, strict=True):
            # Only the matrix's own values are protected; keys an earlier include added can be overwritten.
            if all(base[k] == v for k, v in entry.items() if k in original_keys):
                combo.update(entry)
                fitted = True
        if not fitted:
            added.append((dict(entry), index))
    return [(c, None) for c in extended] + [(c, i) for c, i in added]


def expand(
    axes: Mapping[str, Sequence[object]],
    include: Sequence[Mapping[str, object]] = (),
    exclude: Sequence[Mapping[str, object]] = (),
    defaults: Mapping[str, object] | None = None,
) -> list[Combination]:
    """The job combinations GitHub Actions would run for this matrix, in GitHub's order. `defaults`: the
    value an exclude entry compares with where a combination lacks the key (an axis the matrix may omit)."""
    return [c for c, _ in expand_with_origin(axes, include, exclude, defaults)]
