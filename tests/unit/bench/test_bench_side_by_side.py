"""bench.side_by_side: the summary of its rounds, its alternation and CPU accounting on real processes (a
stand-in nvcc that burns CPU), and its errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # bench/ is not an installed package

from bench import side_by_side as B  # noqa: E402


def _round(alone: float, side: float, *, alone_first: bool = True) -> B.Round:
    return B.Round(
        alone_first=alone_first,
        alone=B.Compile(cpu_s=alone, wall_s=alone),
        side_by_side=B.Compile(cpu_s=side, wall_s=side),
        other=B.Compile(cpu_s=side, wall_s=side),
    )


def test_summary_separates_what_a_neighbour_costs_from_the_drift() -> None:
    # the machine slows by half between rounds; beside another compile each is 10-15% slower than alone
    rounds = [_round(10.0, 11.0), _round(15.0, 16.5), _round(12.0, 13.8)]
    s = B.summarize(rounds)
    assert s.rounds == 3
    assert s.alone_median_cpu_s == 12.0
    assert s.side_by_side_median_cpu_s == 13.8
    assert s.side_by_side_x_alone == 1.15
    # per round: 1.1, 1.1, 1.15
    assert s.paired_x == 1.1
    assert s.alone_spread == 1.5


FAKE_NVCC = """#!/bin/sh
# burns CPU for a while, as long for every TU, then writes the object named after -o
out=""
while [ $# -gt 0 ]; do
  if [ "$1" = "-o" ]; then out="$2"; fi
  shift
done
i=0
while [ $i -lt 60000 ]; do i=$((i + 1)); done
echo "$(date +%s.%N)" > "$out"
"""


def test_measure_alternates_and_counts_each_compiles_cpu(tmp_path: Path) -> None:
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    work = tmp_path / "work"
    work.mkdir()
    rounds = B.measure("light1", "light2", 3, nvcc=str(nvcc), work=work)
    assert [r.alone_first for r in rounds] == [True, False, True]
    for r in rounds:
        for c in (r.alone, r.side_by_side, r.other):
            # the shell's loop is CPU time of the stand-in itself, reaped by wait4
            assert c.cpu_s > 0.02
            assert c.wall_s >= c.cpu_s * 0.5
    assert (work / "a.o").is_file() and (work / "b.o").is_file()


def test_a_failing_compile_is_an_error_naming_the_command(tmp_path: Path) -> None:
    nvcc = tmp_path / "nvcc"
    nvcc.write_text("#!/bin/sh\nexit 3\n")
    nvcc.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"nvcc failed \(3\): .*light1\.cu"):
        B.measure("light1", "light2", 1, nvcc=str(nvcc), work=tmp_path)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--first", "heavy9"], "no fixture TU 'heavy9'"),
        (["--second", "nope"], "no fixture TU 'nope'"),
        (["--rounds", "0"], "--rounds must be at least 1, not 0"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        B.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err.splitlines()[-1]
