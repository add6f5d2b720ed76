"""What `factory build` shows while it runs and when it ends.

On a terminal: a live table. Without one (CI logs, `| tee`): a plain line per running job at least once a
minute and at each phase change, and a summary that is never folded, so a wheel filename or a log path can be
copied whole."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from factory.build.report import BuildReport, JobResult
from factory.core.units import format_size

STYLE = {"ok": "green", "failed": "red", "oom": "magenta", "interrupted": "yellow", "skipped": "dim"}
FINISHED = frozenset(STYLE)
PLAIN_INTERVAL_S = 60.0  # a running job's plain line is never older than this
TICK_S = 5.0  # how often the plain display looks for a running job whose line is due


def elapsed(r: JobResult, now: float) -> float:
    if r.wall_s:
        return r.wall_s
    return now - r.started if r.started is not None else 0.0


def format_duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def compiles_left(r: JobResult, now: float) -> str:
    """The time left: by the share of the source's CUDA files compiled, weighted by the profile's or the
    recipe's times ("; CUDA files 12/40, ~14m10s left by the profile's times"); else by the expected compiles
    not done yet at the pace of those done (", ~4m00s left")."""
    elapsed = now - r.compiles_since if r.compiles_since is not None else 0.0
    if r.device_total:
        shown = f"; CUDA files {r.device_done}/{r.device_total}"
        if 0 < r.device_share < 1 and elapsed > 0:
            left = elapsed * (1 - r.device_share) / r.device_share
            shown += f", ~{format_duration(left)} left {r.device_basis}"
        return shown
    if not (r.compiles_expected >= r.compiles_total and r.compiles_done and elapsed > 0):
        return ""  # no earlier count, or this build outgrew it
    left = max(0, r.compiles_expected - r.compiles_done)
    return f", ~{format_duration(elapsed / r.compiles_done * left)} left" if left else ""


def compiles(r: JobResult, now: float | None = None) -> str:
    """How far the compiles are, over every extension's ninja run (torch runs one per extension, each
    with its own `[k/N]`, so the whole build's total is not known until its last extension starts): "37/120"
    against the total an earlier complete build of the package counted (`compiles_expected`); else while the
    build runs, the compiles done and the running extension's own count ("37 done; extension 3: 5/12"),
    never a fraction of a total that is only the part known so far; "12/15" once the build is over. With
    `now`, while the build runs, the time left (`compiles_left`)."""
    if not r.compiles_total:
        return "-"
    if r.phase != "build":
        return f"{r.compiles_done}/{r.compiles_total}"
    if r.compiles_expected >= r.compiles_total:
        count = f"{r.compiles_done}/{r.compiles_expected} (expected, from an earlier build)"
    elif r.compiles_runs > 1:
        run = f"{r.compiles_run_done}/{r.compiles_run_total}"
        count = f"{r.compiles_done} done; extension {r.compiles_runs}: {run}"
    else:
        count = f"{r.compiles_done}/{r.compiles_total} (extension 1)"
    return count + (compiles_left(r, now) if now is not None else "")


def warning_flag(r: JobResult) -> str:
    """The running job's warnings, each by its first clause ("no nvcc yet after 16 host compile(s)")."""
    return "; ".join("WARNING " + w.split(":", 1)[0] for w in r.warnings)


def cached(r: JobResult) -> str:
    """ "12 cached / 3 compiled": the compiles the cache served and those run, or "-" before any."""
    if not (r.compiles_cached or r.compiles_compiled):
        return "-"
    return f"{r.compiles_cached} cached / {r.compiles_compiled} compiled"


def memory(r: JobResult) -> str:
    if not r.mem_now:
        return "-"
    limit = r.memory_limit
    return f"{format_size(r.mem_now)} / {format_size(limit)}" if limit else format_size(r.mem_now)


def failed(r: JobResult) -> bool:
    """Whether a finished job needs a person's attention (a skipped job was never started)."""
    return r.result not in ("ok", "skipped", "pending")


def ended(r: JobResult) -> str:
    """A failed job's line as it ends: the result and its log; the reason is the summary's, said once."""
    where = [f"log: {r.log}"] if r.log else []
    where += [f"wheel kept: {r.kept_wheel}"] if r.kept_wheel else []
    return f"{r.job_id}: {r.result} (why: in the summary" + "".join(f"; {w}" for w in where) + ")"


def progress_line(r: JobResult, now: float) -> str:
    """One plain line for a job: its phase and what it is doing, or how it ended."""
    if r.phase in FINISHED:
        return ended(r) if failed(r) else f"{r.job_id}: {r.phase}" + (f": {r.wheel}" if r.wheel else "")
    if r.started is None:
        return f"{r.job_id}: {r.phase}"
    parts = [r.phase]
    if r.activity:
        parts.append(r.activity)
    if r.compiles_total:
        parts.append(f"compiles {compiles(r, now)}")
    if r.warnings:
        parts.append(warning_flag(r))
    if r.compiles_cached or r.compiles_compiled:
        parts.append(cached(r))
    if r.mem_now:
        parts.append(f"memory {memory(r)}")
    if r.attempt:
        parts.append(f"attempt {r.attempt}")
    parts.append(format_duration(elapsed(r, now)))
    return f"{r.job_id}: " + ", ".join(parts)


@dataclass
class PlainProgress:
    """When to print a job's plain line: at each phase change, and for a running job once `interval` seconds
    have passed since its last line. Pure: the caller passes the clock's reading."""

    interval: float = PLAIN_INTERVAL_S
    _phase: dict[str, str] = field(default_factory=dict)
    _printed: dict[str, float] = field(default_factory=dict)

    def changed(self, r: JobResult, now: float) -> str | None:
        """The line to print for a change of `r`, when its phase is a new one."""
        if self._phase.get(r.job_id) == r.phase:
            return None
        self._phase[r.job_id] = r.phase
        self._printed[r.job_id] = now
        return progress_line(r, now)

    def due(self, results: Sequence[JobResult], now: float) -> list[str]:
        """The lines of the running jobs that have printed nothing for `interval` seconds."""
        lines = []
        for r in results:
            if r.started is None or r.phase in FINISHED:
                continue
            if now - self._printed.get(r.job_id, r.started) >= self.interval:
                self._printed[r.job_id] = now
                lines.append(progress_line(r, now))
        return lines


def progress_table(results: Sequence[JobResult], now: float) -> Table:
    table = Table(title="factory build", expand=False)
    for col in ("job", "phase", "attempt", "compiles", "cache", "elapsed", "memory", "peak"):
        table.add_column(col)
    for r in results:
        phase = f"[{STYLE.get(r.phase, 'cyan')}]{escape(r.phase)}[/]"
        if r.activity and r.phase not in FINISHED:
            phase += f" {escape(r.activity)}"
        shown = compiles(r, now)
        if r.warnings and r.phase not in FINISHED:
            shown += f"\n[red]{escape(warning_flag(r))}[/]"
        table.add_row(
            escape(r.job_id),
            phase,
            str(r.attempt) if r.attempt else "-",
            shown,
            cached(r),
            format_duration(elapsed(r, now)),
            memory(r),
            format_size(r.peak_bytes) if r.peak_bytes else "-",
        )
    return table


class ProgressView:
    """The live table, made again at each refresh of `rich.live.Live` from a snapshot of the results."""

    def __init__(self, snapshot: Callable[[], Sequence[JobResult]], clock: Callable[[], float]) -> None:
        self.snapshot, self.clock = snapshot, clock

    def __rich__(self) -> Table:
        return progress_table(self.snapshot(), self.clock())


def _detail(r: JobResult, earlier: Sequence[JobResult] = ()) -> str:
    """The wheel, or why there is none: a reason an earlier job of the summary gave already (an image no
    job could pull) is named by that job, not said again."""
    if r.wheel and r.reused_from:
        return f"{r.wheel} (reused from {r.reused_from}, no compile)"
    if not r.wheel and r.reason:
        first = next((e for e in earlier if e.reason == r.reason and not e.wheel), None)
        if first is not None:
            return f"as {first.job_id}"
    return r.wheel or r.reason or ""


def _kept(r: JobResult) -> str:
    return f"wheel kept: {r.kept_wheel}" if r.kept_wheel else ""


def summary_table(report: BuildReport) -> Table:
    """The summary for a terminal, where a folded cell is only a matter of the window's width."""
    table = Table(title="summary")
    for col in ("job", "result", "wall", "peak", "attempts", "cache", "wheel / reason"):
        table.add_column(col, overflow="fold")
    for i, r in enumerate(report.jobs):
        detail = escape(_detail(r, report.jobs[:i]))
        if r.kept_wheel:
            detail += f"\n{escape(_kept(r))}"
        if failed(r) and r.log:
            detail += f"\nlog: {escape(r.log)}"
        table.add_row(
            escape(r.job_id),
            f"[{STYLE.get(r.result, 'white')}]{r.result}[/]",
            format_duration(r.wall_s),
            format_size(r.peak_bytes) if r.peak_bytes else "-",
            str(len(r.attempts)),
            cached(r),
            detail,
        )
    return table


def other_toolkit(r: JobResult) -> bool:
    """Whether the job compiled with another CUDA release than its variant's (the debian flavor's 12.4 for
    a cu128 variant): then the summary names it."""
    if not r.toolkit:
        return False
    release = "".join(r.toolkit.split(".")[:2])
    return not r.variant_id.startswith(f"cu{release}-")


def summary_lines(report: BuildReport) -> list[str]:
    """The summary as plain lines, one per job, each field whole."""
    lines = ["summary:"]
    for i, r in enumerate(report.jobs):
        peak = format_size(r.peak_bytes) if r.peak_bytes else "-"
        served = f"  {cached(r)}" if r.compiles_cached or r.compiles_compiled else ""
        nvcc = f"  nvcc {r.toolkit}" if other_toolkit(r) else ""
        lines.append(
            f"{r.job_id}  {r.result}  wall {format_duration(r.wall_s)}  peak {peak}  "
            f"attempts {len(r.attempts)}{served}{nvcc}  {_detail(r, report.jobs[:i])}".rstrip()
        )
        if r.kept_wheel:
            lines.append(f"  {_kept(r)}")
        if failed(r) and r.log:
            lines.append(f"  log: {r.log}")
    return lines


def is_preflight(report: BuildReport) -> bool:
    return any(r.preflight is not None for r in report.jobs)


def _preflight_row(r: JobResult) -> tuple[str, str, str]:
    """(result, what it found, log) of one job of a preflight: a failure's first error line, a pass's
    compiles; a job that never ran says why."""
    p = r.preflight
    if p is None:
        return r.result, r.reason or "", ""
    return p.result, (p.line or "") if not p.passed else (r.reason or ""), p.log or ""


def preflight_table(report: BuildReport) -> Table:
    table = Table(title="preflight")
    for col in ("job", "result", "first error / compiles", "log"):
        table.add_column(col, overflow="fold")
    for r in report.jobs:
        result, found, log = _preflight_row(r)
        style = "green" if result == "pass" else "red" if result == "fail" else "dim"
        table.add_row(escape(r.job_id), f"[{style}]{escape(result)}[/]", escape(found), escape(log))
    return table


def preflight_lines(report: BuildReport) -> list[str]:
    """A preflight's summary as plain lines, one per variant (its job), each field whole."""
    lines = ["preflight:"]
    for r in report.jobs:
        result, found, log = _preflight_row(r)
        lines.append(f"{r.job_id}  {result}  {found}".rstrip() + (f"  log: {log}" if log else ""))
    return lines


def show_report(console: Console, report: BuildReport, report_path: str, *, interactive: bool) -> None:
    """The summary, the attempts' notes, and for each failed job its reason, log path and log's end."""

    def plain(text: str) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True)

    preflight = is_preflight(report)
    if interactive:
        console.print(preflight_table(report) if preflight else summary_table(report))
    else:
        for line in preflight_lines(report) if preflight else summary_lines(report):
            plain(line)
    for r in report.jobs:
        for a in r.attempts:
            if a.note:
                plain(f"{r.job_id}: {a.note}")
        if not failed(r):
            continue
        # The summary said why and where its log is; here the log's end, less the host's own line of
        # that reason (a failure before any container ran has no other).
        tail = [line for line in r.log_tail if line != f"factory: {r.reason}"]
        if tail:
            # Compiler errors lead the tail (see jobrun.log_tail); then the last lines of the log.
            errors = tail[: tail.index("...") + 1] if "..." in tail else []
            shown = [*errors, *tail[len(errors) :][-15:]]
            plain(f"{r.job_id}: the end of its log:")
            plain("\n".join(f"  {line}" for line in shown))
    plain(f"report: {report_path}")


class BuildDisplay:
    """What `factory build` shows on `console` while jobs run: the live table on a terminal, else plain
    lines (`PlainProgress`) from a ticking thread; then the report. Its methods are the callbacks of
    `factory.build.request.run_planned`, called from the job threads."""

    def __init__(self, console: Console, *, report_path: str) -> None:
        self.console = console
        self.report_path = report_path
        self.interactive = console.is_terminal
        self._lock = threading.Lock()
        self._results: list[JobResult] = []
        self._plain = PlainProgress()

    def say(self, msg: str) -> None:
        self.console.print(msg, markup=False, highlight=False, soft_wrap=True)

    def _snapshot(self) -> list[JobResult]:
        with self._lock:
            return list(self._results)

    def on_change(self, r: JobResult) -> None:
        with self._lock:
            if r not in self._results:
                self._results.append(r)
            line = None if self.interactive else self._plain.changed(r, time.monotonic())
        if line is not None:
            self.say(line)

    def _tick(self, stop: threading.Event) -> None:
        while not stop.wait(TICK_S):
            with self._lock:
                lines = self._plain.due(self._results, time.monotonic())
            for line in lines:
                self.say(line)

    @contextlib.contextmanager
    def showing(self) -> Iterator[None]:
        if self.interactive:
            view = ProgressView(self._snapshot, time.monotonic)
            with Live(view, console=self.console, refresh_per_second=2):
                yield
            return
        stop = threading.Event()
        ticker = threading.Thread(target=self._tick, args=(stop,), name="progress", daemon=True)
        ticker.start()
        try:
            yield
        finally:
            stop.set()
            ticker.join()

    def finished(self, report: BuildReport) -> None:
        show_report(self.console, report, self.report_path, interactive=self.interactive)
