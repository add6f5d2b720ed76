"""The facts a wheel's provenance and SBOM are made of, gathered where the host knows them.

`InputFacts` are a job's inputs (the source and its patches, the builder image's content identity, the
wheelhouse's wheels), made once per run and shared by the jobs with the same inputs; `build_facts` adds the
job and the torch and toolchain the build reported, and gives the frozen
`provenance.BuildFacts` that `provenance.compose` and `sbom.compose` turn into files. `needed_libraries`
reads what each extension module of a wheel links (its ELF DT_NEEDED entries).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from factory.build import images
from factory.build.source import PreparedSource
from factory.build.wheelhouse import wheel_files
from factory.core import bounded
from factory.core.errors import FactoryError
from factory.core.urls import without_credentials
from factory.plan.plan import Job, matrix_env
from factory.spec import toolchains
from factory.spec.config import MatrixFile
from factory.spec.options import Recipe
from factory.spec.recipes import BUILTIN_RECIPES, default_recipe_for
from factory.wheel import provenance

_CHUNK = 1 << 20
MAX_MODULE_BYTES = 4 << 30  # one extension module read for its DT_NEEDED entries
# What a build container reports (its compilers' version lines) and what its modules name (DT_NEEDED) goes
# into the wheel's provenance and SBOM only as short printable text, a library only by a soname's characters.
MAX_REPORTED = 200
_SONAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,254}")


def reported(value: object) -> str:
    """A container's report of a tool version: kept when it is printable text of at most MAX_REPORTED
    characters, else ""."""
    if isinstance(value, str) and value.isprintable() and len(value) <= MAX_REPORTED:
        return value
    return ""


# the image labels that say what an image is made of, by name; its id is the local docker's, not content
IDENTITY_LABELS = (images.LABEL_TOOLKIT, images.LABEL_SUITE, images.LABEL_GCC)


@dataclass(frozen=True, kw_only=True)
class InputFacts:
    """A job's inputs as the provenance names them."""

    source: provenance.SourceFacts
    image: Mapping[str, str]
    build_requirements: tuple[tuple[str, str], ...]


def tree_digest(tree: Path) -> str:
    """A digest of a directory tree's content: each regular file's relative path, mode's executable bit and
    sha256, each link's target (never followed), in sorted order; times and owners are left out."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(tree, followlinks=False):
        dirs.sort()
        for name in sorted(files + [d for d in dirs if (Path(root) / d).is_symlink()]):
            path = Path(root) / name
            rel = path.relative_to(tree).as_posix()
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                entry = f"link {rel} {os.readlink(path)}"
            elif stat.S_ISREG(info.st_mode):
                entry = f"file {rel} {bool(info.st_mode & 0o111):d} {bounded.file_sha256(path)}"
            else:
                continue
            digest.update(entry.encode("utf-8", "surrogateescape") + b"\n")
    return digest.hexdigest()


def patch_facts(patches: Sequence[Path]) -> tuple[tuple[str, str], ...]:
    return tuple((p.name, bounded.file_sha256(p)) for p in patches)


def source_facts(mf: MatrixFile, prepared: PreparedSource, *, commit: str | None) -> provenance.SourceFacts:
    """The source as the provenance names it; a path source by its name and the digest of its tree."""
    src = mf.package.source
    patches = patch_facts(mf.recipe.patches)
    if src.kind == "pypi":
        return provenance.SourceFacts(
            kind="pypi", sdist=prepared.sdist, sha256=prepared.sha256, patches=patches
        )
    if src.kind == "git":
        url = without_credentials(src.url or "")
        return provenance.SourceFacts(
            kind="git", git_url=url, git_ref=src.ref, commit=commit, patches=patches
        )
    name = src.path.name if src.path is not None else ""
    return provenance.SourceFacts(
        kind="path", path=name, tree_sha256=tree_digest(prepared.tree), patches=patches
    )


def wheelhouse_facts(directory: Path) -> tuple[tuple[str, str], ...]:
    """Each wheel of a job's wheelhouse (torch and the build backend among them) with its sha256."""
    return tuple((w.name, bounded.file_sha256(w)) for w in wheel_files(directory))


def image_identity(mf: MatrixFile, job: Job, labels: Mapping[str, str]) -> dict[str, str]:
    """The builder image by what it is made of, the same on every host: its name (which follows from the
    job), the sha256 of its Dockerfile and build arguments, its base image's name and the factory's labels
    of toolkit, suite and compiler. An image named in build.images is its reference. Its docker id, which
    differs between hosts that built the same image, is report.json's."""
    b = mf.build
    explicit = b.images.get(job.variant.cuda)
    if explicit:
        return {"reference": explicit}
    cuda, python, flavor = job.variant.cuda, job.python, b.flavor
    floor = job.glibc
    target = job.platform  # another platform's image and base carry its name (`toolchains.platform_suffix`)
    name = toolchains.builder_image_for(
        cuda=cuda, python=python, flavor=flavor, base_image=b.base_image, floor=floor, target=target
    )
    base = images.base_image_for(
        cuda=cuda, python=python, flavor=flavor, base_image=b.base_image, floor=floor, target=target
    )
    toolchain = toolchains.job_toolchain(python=python, flavor=flavor, base_image=b.base_image, floor=floor)
    if toolchain is not None:
        dockerfile = images.toolchain_dockerfile_text()
        args = images.toolchain_build_args(cuda=cuda, toolchain=toolchain, base_image=base, target=target)
    else:
        dockerfile = images.dockerfile_text(flavor)
        args = images.build_args(cuda=cuda, python=python, flavor=flavor, base_image=base, target=target)
    identity = {
        "name": name,
        "base": base,
        "flavor": flavor,
        "dockerfile_sha256": hashlib.sha256(dockerfile.encode()).hexdigest(),
        "build_args_sha256": hashlib.sha256(json.dumps(args, sort_keys=True).encode()).hexdigest(),
    }
    for label in IDENTITY_LABELS:
        if labels.get(label):
            identity[label.rsplit(".", 1)[-1]] = str(labels[label])
    return identity


# --- the recipe ---------------------------------------------------------------------------------------------


# Recipe fields added after wheels were published: at their default, left out of a recipe's digest and
# document.
_NEWER_FIELDS = ("extra_requires",)


def _recipe_values(recipe: Recipe) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for f in fields(Recipe):
        value = getattr(recipe, f.name)
        if f.name in _NEWER_FIELDS and value == f.default:
            continue  # a recipe that does not use it keeps the digest and document it had before it existed
        if f.name == "patches":
            value = [[p.name, bounded.file_sha256(p)] for p in value]
        elif isinstance(value, Mapping):
            value = dict(sorted(value.items()))
        elif isinstance(value, tuple):
            value = [list(v) if isinstance(v, tuple) else v for v in value]
        values[f.name] = value
    return values


def recipe_digest(recipe: Recipe) -> str:
    """A digest of everything the recipe says, each patch by its content."""
    blob = json.dumps(_recipe_values(recipe), sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()


def recipe_origin(recipe: Recipe, mf: MatrixFile) -> str | None:
    """The built-in recipe's name when `recipe` is one as shipped (or the package's default); None for a
    matrix file's own."""
    if recipe == default_recipe_for(mf.package):
        return recipe.name
    builtin = BUILTIN_RECIPES.get(recipe.name)
    if builtin is not None and recipe_digest(builtin) == recipe_digest(recipe):
        return recipe.name
    return None


def recipe_document(recipe: Recipe) -> dict[str, Any]:
    """A matrix file's `recipe:` mapping that gives `recipe` again; its patches named `patches/<file>`."""
    values = _recipe_values(recipe)
    values.pop("package", None)
    values.pop("versions", None)
    values["patches"] = [f"patches/{p.name}" for p in recipe.patches]
    for key in ("compile_gib_by_file", "compile_seconds_by_file"):
        values[key] = {glob: n for glob, n in getattr(recipe, key)}
    return {k: v for k, v in values.items() if v is not None}


def recipe_facts(mf: MatrixFile) -> provenance.RecipeFacts:
    recipe = mf.recipe
    builtin = recipe_origin(recipe, mf)
    return provenance.RecipeFacts(
        name=recipe.name,
        origin="built-in" if builtin else "matrix file",
        sha256=recipe_digest(recipe),
        document=builtin if builtin else recipe_document(recipe),
    )


# --- the rebuild --------------------------------------------------------------------------------------------


def rebuild_matrix(
    mf: MatrixFile, job: Job, source: provenance.SourceFacts, recipe: provenance.RecipeFacts
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """A matrix document of this one job, and what building it needs beside the document."""
    needs: list[str] = []
    package: dict[str, Any] = {"name": mf.package.name, "version": mf.package.version}
    if source.kind == "pypi":
        package["source"] = "pypi"
        if source.sha256:
            package["sha256"] = source.sha256
        needs.append("the sdist on an index the host's pip configuration reaches (its sha256 is pinned)")
    elif source.kind == "git":
        package["source"] = {"git": source.git_url, "ref": source.commit or source.git_ref}
        needs.append("the git repository, with the commit checked out")
    else:
        package["source"] = {"path": source.path}
        needs.append(
            f"the source directory {source.path} beside the document, whose patched tree has "
            "source.path.tree_sha256"
        )
    if recipe.origin != "built-in" and source.patches:
        needs.append("the recipe's patches under patches/ beside the document (sha256s in source.patches)")
    axes: dict[str, Any] = {
        "cuda": [job.variant.cuda],
        "torch": [job.variant.torch],
        "python": list(job.pythons),
        "cxx11_abi": [job.variant.cxx11_abi],
        "arch": [job.variant.arch],
    }
    if job.env:
        axes["include"] = [{"cuda": job.variant.cuda, "env": dict(sorted(job.env.items()))}]
    b = mf.build
    build: dict[str, Any] = {"flavor": b.flavor, "cache": False}
    if job.variant.cuda in b.torch_index:
        build["torch_index"] = {job.variant.cuda: b.torch_index[job.variant.cuda]}
    if job.variant.cuda in b.images:
        build["images"] = {job.variant.cuda: b.images[job.variant.cuda]}
    if b.base_image:
        build["base_image"] = b.base_image
    if job.glibc:  # the job's floor (torch's resolved to its version) picks its builder: the same one again
        build["glibc"] = job.glibc
    needs.append("the build requirements' wheels (build_requirements) on the indexes the job's came from")
    document = {"package": package, "recipe": recipe.document, "matrix": axes, "build": build}
    return document, tuple(needs)


def sbom_path(package: str) -> str:
    """The SBOM's path inside the .dist-info (PEP 770's `sboms/`)."""
    return f"{provenance.SBOM_DIR}/{package}.cdx.json"


def build_facts(
    mf: MatrixFile,
    job: Job,
    *,
    inputs: InputFacts,
    version: str,
    torch_version: str,
    toolchain: Mapping[str, Any] | None,
    toolkit: str | None,
    factory_version: str,
) -> provenance.BuildFacts:
    """The provenance's facts of one job's wheel (`version`: the wheel's, with its local label)."""
    recipe = recipe_facts(mf)
    rebuild, needs = rebuild_matrix(mf, job, inputs.source, recipe)
    tools = toolchain if isinstance(toolchain, Mapping) else {}
    nvcc, cxx = tools.get("nvcc"), tools.get("cxx")
    return provenance.BuildFacts(
        package=mf.package.name,
        version=version,
        job_id=job.id,
        python=job.python,
        covers=job.covers,
        limited_api=job.limited_api,
        cuda=job.variant.cuda,
        torch=job.variant.torch,
        torch_version=torch_version,
        cxx11_abi=job.variant.cxx11_abi,
        archs=tuple(job.variant.archs),
        cxx_std=mf.recipe.cxx_std,
        env=matrix_env(mf, job),
        flavor=mf.build.flavor,
        source=inputs.source,
        recipe=recipe,
        image=inputs.image,
        toolkit=toolkit,
        nvcc=reported(nvcc),
        cxx=reported(cxx),
        build_requirements=inputs.build_requirements,
        factory_version=factory_version,
        rebuild=rebuild,
        rebuild_needs=needs,
        sbom=sbom_path(mf.package.canonical_name),
    )


# --- what the wheel links -----------------------------------------------------------------------------------


def elf_needed(path: Path) -> tuple[str, ...]:
    """The DT_NEEDED entries of an ELF shared object; () for anything pyelftools cannot read as one."""
    from elftools.elf.dynamic import DynamicSection
    from elftools.elf.elffile import ELFFile

    try:
        with path.open("rb") as fh:
            elf = ELFFile(fh)
            found: list[str] = []
            for section in elf.iter_sections():
                if isinstance(section, DynamicSection):
                    names = (getattr(tag, "needed", "") for tag in section.iter_tags("DT_NEEDED"))
                    found += [n for n in names if isinstance(n, str) and _SONAME.fullmatch(n)]
            return tuple(dict.fromkeys(found))
    except Exception:  # a hostile or broken module: the wheel check says what is wrong with it
        return ()


def needed_libraries(wheel: Path) -> dict[str, tuple[str, ...]]:
    """Each extension module of the wheel (its path in the archive) and the libraries it links."""
    from factory.wheel.checks import is_extension_module

    out: dict[str, tuple[str, ...]] = {}
    try:
        with bounded.open_zip(wheel) as archive, tempfile.TemporaryDirectory(prefix="factory-needed-") as tmp:
            for info in archive.infolist():
                if info.is_dir() or not is_extension_module(info.filename):
                    continue
                if info.file_size > MAX_MODULE_BYTES:
                    continue
                target = Path(tmp) / "module.so"
                with archive.open(info) as src, target.open("wb") as dst:
                    while block := src.read(_CHUNK):
                        dst.write(block)
                out[info.filename] = elf_needed(target)
    except (OSError, zipfile.BadZipFile) as exc:
        raise FactoryError(f"{wheel.name}: cannot read its extension modules ({exc})") from None
    return out
