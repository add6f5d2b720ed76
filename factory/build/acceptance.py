"""Accepting a job's wheel: taken out of the container's output, labelled, its torch pinned, its platform
tag repaired, checked, then installed and imported in a fresh container of each Python it serves; moved to
the output only then. A wheel that built and failed a check is kept, so mending the check needs no compile.
"""

from __future__ import annotations

import os
import re
import shutil
import zipfile
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from packaging.utils import parse_wheel_filename

from factory import version
from factory.build import facts as buildfacts
from factory.build import jobspec, logs
from factory.build.jobcontext import DriverOutcome, JobContext, JobInputs
from factory.build.report import JobResult
from factory.build.reuse import Reuse, provenance_problems, reused_torch
from factory.core import bounded, leftovers, reproducible, safefs
from factory.core.errors import CheckError
from factory.core.urls import printable
from factory.plan.plan import Job
from factory.spec.config import MatrixFile
from factory.wheel import checkrecord, checks, embedded, platform_tag, provenance

CHECK_FAILED_DIR = "check-failed"  # under the output: a wheel that built and failed a check, kept
# a wheel the driver names: one plain file name of the wheel format, nothing that could leave its directory
WHEEL_NAME = re.compile(r"[A-Za-z0-9_.+-]+\.whl")
MAX_WHEEL_BYTES = 16 << 30
MAX_CHECK_LOG = 1 << 20  # of a check's log segment, the end read for its failure's reason


def read_tail_from(path: Path, offset: int, max_bytes: int = MAX_CHECK_LOG) -> str:
    """The log from `offset`, at most its last `max_bytes` (what a check container wrote is bounded here)."""
    try:
        with path.open("rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            fh.seek(max(offset, end - max_bytes))
            return fh.read(max_bytes).decode("utf-8", "replace")
    except OSError:
        return ""


def with_torch(job: Job, torch: str) -> Job:
    """The job as another torch's: what `prepare` gives it is that torch's wheelhouse (a stable-ABI wheel's
    install check with a torch it covers)."""
    return replace(job, variant=replace(job.variant, torch=torch))


def oldest_torch_job(job: Job) -> Job | None:
    """A stable-ABI job as its oldest covered torch's, when that is not the torch it builds with."""
    if job.torches and job.torches[0] != job.variant.torch:
        return with_torch(job, job.torches[0])
    return None


class _Trace(Protocol):
    @property
    def trace(self) -> logs.BuildTrace: ...


class JobSide(Protocol):
    """What the acceptance of a wheel needs of its job's run (`jobrun.JobRun` is one): its context, job and
    result, its log, and a driver phase run in its containers."""

    ctx: JobContext
    mf: MatrixFile
    job: Job
    result: JobResult
    log_path: Path

    @property
    def lines(self) -> _Trace: ...

    def note(self, line: str) -> None: ...

    def changed(self) -> None: ...

    def driver_env(self, python: str | None = None) -> dict[str, str]: ...

    def run_driver(
        self, phase: str, *, image: str, env: Mapping[str, str], mounts: Mapping[str, Mapping[str, str]]
    ) -> DriverOutcome: ...


class Acceptance:
    """The wheel side of one `JobRun`: what it records goes into the run's result and log."""

    def __init__(self, run: JobSide) -> None:
        self.run = run
        self.ctx = run.ctx
        self.mf = run.mf
        self.job = run.job
        self.result = run.result

    @property
    def wheel_dir(self) -> Path:
        """Where the host keeps its copy of the job's wheel while it checks it: no container writes there.
        Beside the output (a rename away from it), owned like the container's, so a dead run's is removed."""
        return leftovers.output_tmp_dir(self.ctx.output, job_id=f"{self.job.id}-host", run_id=self.ctx.run_id)

    def take_wheel(self, out_dir: Path, name: object) -> Path | None:
        """The wheel the driver named, copied out of the container-written output directory into the host's
        own (`safefs`: a plain file name, a regular file, no link followed, bounded); None when there is no
        such wheel."""
        if not isinstance(name, str) or not WHEEL_NAME.fullmatch(name):
            return None
        shutil.rmtree(self.wheel_dir, ignore_errors=True)
        leftovers.make_output_tmp_dir(self.wheel_dir)
        try:
            safefs.copy_out(out_dir, name, self.wheel_dir, name, max_bytes=MAX_WHEEL_BYTES)
        except OSError:
            return None
        return self.wheel_dir / name

    def install_check(
        self,
        wheel: Path,
        *,
        python: str,
        image: str,
        mounts: Mapping[str, Mapping[str, str]],
        prepare: Callable[[Job], JobInputs],
        torch: str | None = None,
    ) -> bool:
        """Install the wheel with its torch into a fresh venv of `python` and import it. A Python the job's
        abi3 wheel covers, or a torch its stable-ABI wheel covers, is checked in the image and with the
        wheelhouse a job of that Python and torch would get (`prepare`'s)."""
        job, result = self.job, self.result
        other_torch = torch is not None and torch != job.variant.torch
        if python != job.python or other_torch:
            if python != job.python:
                self.run.note(
                    f"install check on Python {python}, which the {job.interpreter}-abi3 wheel covers"
                )
            checked = replace(job, python=python, covers=())
            if torch is not None and other_torch:
                self.run.note(
                    f"install check with torch {torch}, which the stable-ABI wheel "
                    f"(torch>={job.variant.stable_abi}) covers"
                )
                checked = with_torch(checked, torch)
            inputs = prepare(checked)
            image = inputs.image
            mounts = jobspec.check_mounts(
                mounts,
                wheel_dir=wheel.parent,
                wheelhouse=inputs.wheelhouse,
                check_wheelhouse=inputs.check_wheelhouse,
            )
        else:
            mounts = jobspec.check_mounts(mounts, wheel_dir=wheel.parent)
        env = jobspec.check_env(
            self.run.driver_env(python), wheel=wheel.name, import_name=self.mf.recipe.import_name
        )
        start = self.run.log_path.stat().st_size if self.run.log_path.exists() else 0
        outcome = self.run.run_driver("check", image=image, env=env, mounts=mounts)
        if outcome.exit_code != 0:
            result.result = "failed"
            on = f" on Python {python}" if python != job.python else ""
            on += f" with torch {torch}" if other_torch else ""
            why = logs.check_failure_reason(read_tail_from(self.run.log_path, start))
            result.reason = f"install/import check{on} failed (exit {outcome.exit_code})" + (
                f": {why}" if why else ""
            )
            return False
        if python not in result.checked_pythons:
            result.checked_pythons.append(python)
        if torch is not None and torch not in result.checked_torches:
            result.checked_torches.append(torch)
        return True

    def accept(
        self,
        *,
        wheel: Path,
        torch: str,
        image: str,
        mounts: Mapping[str, Mapping[str, str]],
        prepare: Callable[[Job], JobInputs],
        inputs: JobInputs | None = None,
        toolchain: object = None,
        epoch: int = reproducible.DEFAULT_EPOCH,
    ) -> None:
        """Label, retag the platform, pin torch and add the provenance and SBOM (`inputs`' facts, the build's
        `toolchain` mark), check the wheel, then install and import it in a fresh container; only then is it
        moved to the output. A wheel that built and failed a check is kept (`keep_wheel`), so that mending
        the check needs no compile. The torch pin is the last rewrite, after auditwheel's: it writes the
        canonical archive, dated from the source's `epoch` (`reproducible`)."""
        job, result = self.job, self.result
        result.phase = "check"
        self.run.changed()
        self.run.note("checking the wheel")
        passed = False
        try:
            wheel = self.label(wheel, epoch=epoch)
            stable = job.variant.stable_abi
            wheel = platform_tag.repair_platform_tag(wheel, wheel.parent)
            facts = self.facts(wheel, torch=torch, inputs=inputs, toolchain=toolchain)
            extra = None if facts is None else embedded.files(facts, buildfacts.needed_libraries(wheel))
            checks.pin_torch_requirement(
                wheel,
                torch,
                stable_abi=stable,
                extra=extra,
                epoch=epoch,
                requires=self.mf.recipe.extra_requires,
            )
            problems = checks.check_wheel(
                wheel,
                name=self.mf.package.name,
                version=self.mf.package.version,
                local_version=job.variant.local_version,
                python=job.python,
                torch_version=torch,
                archs=job.variant.archs,
                machine=job.platform.name,
                limited_api=job.limited_api,
                host_only=self.host_only(wheel),
                stable_abi=stable,
                glibc=job.glibc,
            )
            if facts is not None:
                problems += embedded.wheel_problems(wheel, provenance.compose(facts))
            if problems:
                result.result = "failed"
                result.reason = "wheel check failed: " + "; ".join(problems)
                return
            # a stable-ABI wheel: with the oldest and the newest torch it covers (the newest built it)
            torches = dict.fromkeys((job.torches[-1], job.torches[0]) if job.torches else (None,))
            for checked_torch in torches:
                for python in job.pythons:
                    if not self.install_check(
                        wheel, python=python, image=image, mounts=mounts, prepare=prepare, torch=checked_torch
                    ):
                        return
            passed = True
        finally:
            if not passed:
                self.keep_wheel(wheel)
        final = self.ctx.output / wheel.name
        os.replace(wheel, final)
        final.chmod(0o644)
        result.wheel = final.name
        result.result = "ok"

    def facts(
        self, wheel: Path, *, torch: str, inputs: JobInputs | None, toolchain: object
    ) -> provenance.BuildFacts | None:
        """What the wheel's provenance says (`buildfacts.build_facts`); None where the job's inputs came
        without their facts."""
        if inputs is None or inputs.facts is None:
            return None
        return buildfacts.build_facts(
            self.mf, self.job, inputs=inputs.facts,
            version=str(parse_wheel_filename(wheel.name)[1]), torch_version=torch,
            toolchain=toolchain if isinstance(toolchain, Mapping) else None, toolkit=inputs.toolkit,
            factory_version=version(),
        )  # fmt: skip

    def label(self, wheel: Path, *, epoch: int) -> Path:
        """The wheel with the variant's local version label: as built when its setup.py read the label,
        else set by the host (`wheelcheck.set_local_version`), whatever the recipe."""
        label = self.job.variant.local_version
        if not label:
            return wheel
        labelled = checks.set_local_version(wheel, label, epoch=epoch)
        if labelled is None:
            return wheel
        self.run.note(f"the wheel's version had no local label: {wheel.name} is now {labelled.name}")
        return labelled

    def host_only(self, wheel: Path) -> tuple[str, ...]:
        """The extension modules the wheel check lets carry no device code: those whose link in the build
        had no object nvcc compiled (`buildlog.module_kinds`), and the recipe's `host_only_libraries`,
        which are taken as they are; where the two disagree the log says so."""
        try:
            with bounded.open_zip(wheel) as archive:
                members = [n for n in archive.namelist() if checks.is_extension_module(n)]
        except (zipfile.BadZipFile, OSError):
            return self.mf.recipe.host_only_libraries  # the wheel check says what is wrong with it
        kinds = logs.module_kinds(members, self.run.lines.trace)
        self.run.note(f"extension modules: {logs.describe_kinds(kinds)}")
        inferred = logs.host_only_globs(kinds)
        self.result.host_only = sorted(m for m, k in kinds.items() if k == logs.HOST)
        explicit = self.mf.recipe.host_only_libraries
        for member, kind in sorted(kinds.items()):
            if kind == logs.DEVICE and any(checks.library_glob_matches(member, g) for g in explicit):
                self.run.note(
                    f"the recipe's host_only_libraries names {printable(member)}, whose link has objects "
                    "nvcc compiled: it is excused from carrying device code as the recipe says"
                )
        return tuple(dict.fromkeys([*explicit, *inferred]))

    def keep_wheel(self, wheel: Path) -> None:
        """Keep a wheel that built but failed a check in `<output>/check-failed/`, named in the report and
        the summary: checking it again needs no compile (and a rerun finds its compiles in the cache)."""
        if not wheel.is_file() or wheel.is_symlink():
            return
        kept_dir = self.ctx.output / CHECK_FAILED_DIR
        try:
            kept_dir.mkdir(exist_ok=True)
            kept = kept_dir / wheel.name
            os.replace(wheel, kept)
            kept.chmod(0o644)
        except OSError as exc:
            self.run.note(f"the wheel could not be kept: {exc}")
            return
        self.result.kept_wheel = str(kept)
        self.run.note(f"the wheel that failed its check is kept: {kept}")
        try:  # beside it, so that `factory publish` refuses it wherever it is copied with its record
            checkrecord.write_beside(
                kept, job=self.job.id, reason=self.result.reason or "its checks did not finish"
            )
        except OSError as exc:
            self.run.note(f"the wheel's failure record could not be written: {exc}")


def reused_provenance(acceptance: Acceptance, wheel: Path, *, inputs: JobInputs) -> list[str]:
    """Where a reused wheel's provenance is missing or says another job or source made it."""
    try:
        found = embedded.read(wheel)
    except CheckError as exc:
        return [str(exc).removeprefix(f"{wheel.name}: ")]
    torch = reused_torch(found.provenance) or acceptance.job.variant.torch
    facts = acceptance.facts(wheel, torch=torch, inputs=inputs, toolchain=None)
    if facts is None:  # nothing to compare it with: not taken on its word
        return ["provenance: the job's inputs came without their facts, so the wheel's cannot be checked"]
    return provenance_problems(found.provenance, provenance.compose(facts))


def accept_reused(
    acceptance: Acceptance,
    reuse: Reuse,
    *,
    image: str,
    mounts: Mapping[str, Mapping[str, str]],
    prepare: Callable[[Job], JobInputs],
    inputs: JobInputs,
) -> None:
    """Take a published stable-ABI wheel (fetched) as the job's, its bytes unchanged: the wheel check with
    its stable-ABI symbol check, its provenance against the job's, then install and import with each torch
    whose page lacks it (`Acceptance.install_check`); only then is it moved to the output for publishing. A
    failure fails the job, with its reason, and nothing is published."""
    job, result, run = acceptance.job, acceptance.result, acceptance.run
    result.phase = "check"
    result.reused_from = reuse.source
    run.changed()
    if reuse.problem is not None or reuse.wheel is None:
        result.result = "failed"
        result.reason = f"the published wheel cannot be reused: {reuse.problem or 'not fetched'}"
        return
    run.note(
        f"reusing {reuse.filename} (sha256 {reuse.sha256}) published on {reuse.source}: no compile; "
        f"checked with torch {', '.join(reuse.torches)} for {', '.join(reuse.missing)}"
    )
    shutil.rmtree(acceptance.wheel_dir, ignore_errors=True)
    leftovers.make_output_tmp_dir(acceptance.wheel_dir)
    wheel = acceptance.wheel_dir / reuse.filename
    shutil.copyfile(reuse.wheel, wheel)
    problems = checks.check_wheel(
        wheel,
        name=acceptance.mf.package.name,
        version=acceptance.mf.package.version,
        local_version=job.variant.local_version,
        python=job.python,
        torch_version=job.variant.torch,
        archs=job.variant.archs,
        machine=job.platform.name,
        limited_api=job.limited_api,
        host_only=acceptance.host_only(wheel),
        stable_abi=job.variant.stable_abi,
        glibc=job.glibc,
    )
    if not problems:
        problems += reused_provenance(acceptance, wheel, inputs=inputs)
    if problems:
        result.result = "failed"
        result.reason = f"the published wheel {reuse.filename} fails its check: " + "; ".join(problems)
        return
    for torch in reuse.torches:
        for python in job.pythons:
            if not acceptance.install_check(
                wheel, python=python, image=image, mounts=mounts, prepare=prepare, torch=torch
            ):
                result.reason = f"the published wheel {reuse.filename}: {result.reason}"
                return
    final = acceptance.ctx.output / wheel.name
    os.replace(wheel, final)
    final.chmod(0o644)
    result.wheel = final.name
    result.result = "ok"
    result.reason = f"reused from {reuse.source}"
