"""Malformed matrix files through the real CLI: one line "FILE:LINE: message", exit 2, no traceback.

Each case marks the line the error must point at with `#<`.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

GOOD_AXES = """\
  cuda: ["13.0"]
  torch: ["2.10"]
  python: ["3.11"]
  cxx11_abi: [true]
  arch: ["8.0;9.0"]
"""
HEAD = 'package: {name: flash-attn, version: "2.8.3"}\n'

CASES: dict[str, tuple[str, str]] = {
    "yaml-syntax": (HEAD + 'matrix:\n  cuda: ["13.0"\n  torch: ["2.10"] #<\n', "YAML syntax error"),
    "duplicate-key": (HEAD + "matrix:\n" + GOOD_AXES + '  cuda: ["12.8"] #<\n', "duplicate key 'cuda'"),
    "duplicate-top-key": (
        HEAD + "matrix:\n" + GOOD_AXES + 'package: {name: x, version: "1"} #<\n',
        "duplicate key 'package'",
    ),
    "unknown-top-key": (
        HEAD + "matrix:\n" + GOOD_AXES + "bulid: {} #<\n",
        "unknown key 'bulid' in the top level",
    ),
    "unknown-build-key": (
        HEAD + "matrix:\n" + GOOD_AXES + "build:\n  concurency: 2 #<\n",
        "unknown key 'concurency' in build (did you mean 'concurrency'?)",
    ),
    "unquoted-torch-floats": (
        HEAD + 'matrix:\n  cuda: ["13.0"]\n  torch: [2.9, 2.10] #<\n  python: ["3.11"]\n  cxx11_abi: [true]\n'
        '  arch: ["8.0"]\n',
        'torch version 2.1 must be a quoted string (write "2.10")',
    ),
    "unquoted-python": (
        HEAD + 'matrix:\n  cuda: ["13.0"]\n  torch: ["2.10"]\n  python:\n    - 3.10 #<\n  cxx11_abi: [true]\n'
        '  arch: ["8.0"]\n',
        'python version 3.1 must be a quoted string (write "3.10")',
    ),
    "unquoted-cuda-int": (
        HEAD + 'matrix:\n  cuda: [13] #<\n  torch: ["2.10"]\n  python: ["3.11"]\n  cxx11_abi: [true]\n'
        '  arch: ["8.0"]\n',
        'cuda version 13 must be a quoted string (write "13")',
    ),
    "unquoted-arch": (
        HEAD + "matrix:\n" + GOOD_AXES.replace('["8.0;9.0"]', "[8.0] #<"),
        'arch 8.0 must be a quoted string (write "8.0")',
    ),
    "empty-axis": (HEAD + "matrix:\n" + GOOD_AXES.replace('["3.11"]', "[] #<"), "matrix.python is empty"),
    "axis-not-a-list": (
        HEAD + "matrix:\n" + GOOD_AXES.replace('["13.0"]', '"13.0" #<'),
        "matrix.cuda must be a list, not a string",
    ),
    "bad-torch-version": (
        HEAD + "matrix:\n" + GOOD_AXES.replace('["2.10"]', '["2.x"] #<'),
        "torch version '2.x' is not a version like 2.10",
    ),
    "bad-python-version": (
        HEAD + "matrix:\n" + GOOD_AXES.replace('["3.11"]', '["311"] #<'),
        "python version '311' is not a version like 3.11",
    ),
    "unknown-arch": (
        HEAD + "matrix:\n" + GOOD_AXES.replace('["8.0;9.0"]', '["8.0;8.5"] #<'),
        "unknown arch '8.5'",
    ),
    "arch-syntax": (
        HEAD + "matrix:\n" + GOOD_AXES.replace('["8.0;9.0"]', '["sm_80"] #<'),
        "not a compute capability like 8.0 or 9.0a",
    ),
    "abi-string": (
        HEAD + "matrix:\n" + GOOD_AXES.replace("[true]", "[yes] #<"),
        "cxx11_abi must be true or false, not a string 'yes'",
    ),
    "duplicate-axis-value": (
        HEAD + "matrix:\n" + GOOD_AXES.replace('["8.0;9.0"]', '["8.0;9.0", "9.0;8.0"] #<'),
        "matrix.arch lists '8.0;9.0' twice",
    ),
    "unknown-axis": (HEAD + "matrix:\n" + GOOD_AXES + "  os: [linux] #<\n", "unknown key 'os' in matrix"),
    "incomplete-include": (
        HEAD + "matrix:\n" + GOOD_AXES + '  include:\n    - cuda: "12.8" #<\n      torch: "2.9"\n',
        "incomplete job cuda=12.8, torch=2.9: missing python, cxx11_abi, arch",
    ),
    "incomplete-matrix": (
        HEAD + 'matrix: #<\n  cuda: ["13.0"]\n  torch: ["2.10"]\n  python: ["3.11"]\n  cxx11_abi: [true]\n',
        "missing arch",
    ),
    "exclude-non-axis": (
        HEAD + "matrix:\n" + GOOD_AXES + '  exclude:\n    - pyhton: "3.11" #<\n',
        "'pyhton' is not a matrix axis (did you mean 'python'?)",
    ),
    "include-computed-key": (
        HEAD + "matrix:\n" + GOOD_AXES + "  include:\n    - id: x #<\n",
        "'id' is computed by the factory",
    ),
    "include-not-mapping": (
        HEAD + "matrix:\n" + GOOD_AXES + "  include:\n    - just-a-string #<\n",
        "matrix.include[0] must be a non-empty mapping",
    ),
    "include-env-bool": (
        HEAD + "matrix:\n" + GOOD_AXES + "  include:\n    - env: {FORCE: true} #<\n",
        "matrix.include[0].env.FORCE must be a string",
    ),
    "package-missing-version": (
        "package: #<\n  name: flash-attn\nmatrix:\n" + GOOD_AXES,
        "package: missing required key 'version'",
    ),
    "package-local-version": (
        'package:\n  name: flash-attn\n  version: "2.8.3+cu12" #<\nmatrix:\n' + GOOD_AXES,
        "must not have a local label",
    ),
    "package-bad-version": (
        'package:\n  name: flash-attn\n  version: "two" #<\nmatrix:\n' + GOOD_AXES,
        "package.version 'two' is not a PEP 440 version",
    ),
    "package-float-version": (
        "package:\n  name: flash-attn\n  version: 2.80 #<\nmatrix:\n" + GOOD_AXES,
        'package.version 2.8 must be a quoted string (write "2.80")',
    ),
    "source-missing-path": (
        'package:\n  name: x\n  version: "1.0"\n  source: {path: does-not-exist} #<\nmatrix:\n' + GOOD_AXES,
        "package.source.path 'does-not-exist': no such directory",
    ),
    "source-git-without-ref": (
        'package:\n  name: x\n  version: "1.0"\n  source:\n    git: https://h.invalid/x.git #<\nmatrix:\n'
        + GOOD_AXES,
        "package.source.git needs a ref:",
    ),
    "unknown-recipe": (
        HEAD + "recipe: flash-attention #<\nmatrix:\n" + GOOD_AXES,
        "unknown recipe 'flash-attention'",
    ),
    "recipe-arch-format": (
        HEAD + "recipe:\n  name: r\n  arch_format: cmake #<\nmatrix:\n" + GOOD_AXES,
        "recipe.arch_format 'cmake' must be",
    ),
    "recipe-missing-patch": (
        HEAD + "recipe:\n  name: r\n  patches:\n    - nope.diff #<\nmatrix:\n" + GOOD_AXES,
        "recipe.patches item 'nope.diff': no such file",
    ),
    "recipe-bad-env-name": (
        HEAD + "recipe:\n  name: r\n  arch_env: 1BAD #<\nmatrix:\n" + GOOD_AXES,
        "recipe.arch_env '1BAD' is not an environment variable name",
    ),
    "build-memory": (
        HEAD + "matrix:\n" + GOOD_AXES + "build:\n  memory: lots #<\n",
        "build.memory: size 'lots' is not a size like 16GiB",
    ),
    "build-flavor": (
        HEAD + "matrix:\n" + GOOD_AXES + "build:\n  flavor: conda #<\n",
        "build.flavor 'conda' must be one of 'devel', 'pypi', 'manylinux', 'debian'",
    ),
    "build-concurrency": (
        HEAD + "matrix:\n" + GOOD_AXES + "build:\n  concurrency: 0 #<\n",
        "build.concurrency must be at least 1, not 0",
    ),
    "build-images-float-key": (
        HEAD + "matrix:\n" + GOOD_AXES + "build:\n  images:\n    13.0: img #<\n",
        'CUDA version 13.0 must be a quoted string (write "13.0")',
    ),
    "git-url-option": (
        'package:\n  name: x\n  version: "1"\n  source: {git: "--upload-pack=x", ref: v1} #<\nmatrix:\n'
        + GOOD_AXES,
        "package.source.git '--upload-pack=x' is not a repository URL",
    ),
    "git-ref-option": (
        'package:\n  name: x\n  version: "1"\n'
        + '  source: {git: "https://h/r.git", ref: "--orphan=x"} #<\nmatrix:\n'
        + GOOD_AXES,
        "package.source.ref '--orphan=x' is not a tag, branch or commit",
    ),
    # issue 41 §7: git's transports that run a program are the factory's to refuse, before git runs
    "git-ext-transport": (
        'package:\n  name: x\n  version: "1"\n'
        + '  source: {git: "ext::sh -c touch% /tmp/pwned", ref: v1} #<\nmatrix:\n'
        + GOOD_AXES,
        "package.source.git 'ext::sh -c touch% /tmp/pwned': the ext:: transport runs a program",
    ),
    "git-fd-transport": (
        'package:\n  name: x\n  version: "1"\n  source: {git: "fd::7", ref: v1} #<\nmatrix:\n' + GOOD_AXES,
        "the fd:: transport runs a program (a git remote helper)",
    ),
    "git-helper-scheme": (
        'package:\n  name: x\n  version: "1"\n  source: {git: "s3://b/r.git", ref: v1} #<\nmatrix:\n'
        + GOOD_AXES,
        "the s3:// transport is not one the factory uses; the factory clones over https://",
    ),
    # a 10,000-character name is cut in the one line that names it
    "package-name-long": (
        f'package:\n  name: {"a" * 10_000} #<\n  version: "1"\nmatrix:\n' + GOOD_AXES,
        f"package.name '{'a' * 63}…' is 10000 characters long; at most 128",
    ),
    "package-name-long-invalid": (
        f'package:\n  name: {"a" * 10_000}- #<\n  version: "1"\nmatrix:\n' + GOOD_AXES,
        f"package.name '{'a' * 63}…' is not a valid distribution name",
    ),
    "build-cpus-nan": (
        HEAD + "matrix:\n" + GOOD_AXES + "build:\n  cpus: .nan #<\n",
        "build.cpus must be a finite number, not nan",
    ),
    "build-cpus-inf": (
        HEAD + "matrix:\n" + GOOD_AXES + "build:\n  cpus: .inf #<\n",
        "build.cpus must be a finite number, not inf",
    ),
    "build-base-image": (
        HEAD + "matrix:\n" + GOOD_AXES + "build:\n  base_image: my base #<\n",
        "build.base_image 'my base' is not a Docker image reference (like factory-base:bookworm)",
    ),
    "build-images-reference": (
        HEAD + "matrix:\n" + GOOD_AXES + 'build:\n  images:\n    "13.0": Nvidia/Cuda #<\n',
        "build.images.13.0 'Nvidia/Cuda' is not a Docker image reference (like factory-base:bookworm)",
    ),
    "torch-index-url": (
        HEAD + "matrix:\n" + GOOD_AXES + 'build:\n  torch_index: {"13.0": pytorch} #<\n',
        "build.torch_index.13.0 pytorch: not a URL of file:// or http:// or https:// (or 'default')",
    ),
    "torch-index-no-host": (
        HEAD
        + "matrix:\n"
        + GOOD_AXES
        + 'build:\n  torch_index:\n    "12.8": default\n    "13.0": "https://" #<\n',
        "build.torch_index.13.0 https://: not a URL of file:// or http:// or https://",
    ),
    # a private index's token is never repeated, even when the URL around it is broken
    "torch-index-credentials": (
        HEAD + "matrix:\n" + GOOD_AXES + 'build:\n  torch_index: {"13.0": "https://ci:t0ken@[::1/x"} #<\n',
        "build.torch_index.13.0 https://[::1/x: Invalid IPv6 URL",
    ),
    "publish-endpoint-scheme": (
        HEAD + "matrix:\n" + GOOD_AXES + "publish:\n  to: s3://bkt/p\n  endpoint_url: ftp://minio:9000 #<\n",
        "publish.endpoint_url ftp://minio:9000: not a URL of http:// or https://",
    ),
    "publish-endpoint-no-host": (
        HEAD + "matrix:\n" + GOOD_AXES + "publish:\n  to: s3://bkt/p\n  endpoint_url: http://:9000 #<\n",
        "publish.endpoint_url http://:9000: not a URL of http:// or https://",
    ),
    "publish-to-scheme": (
        HEAD + "matrix:\n" + GOOD_AXES + "publish:\n  to: https://example.com/idx #<\n",
        "publish.to 'https://example.com/idx': use a directory or s3://bucket/prefix",
    ),
    "publish-to-no-bucket": (
        HEAD + "matrix:\n" + GOOD_AXES + "publish:\n  to: s3:///prefix #<\n",
        "publish.to s3:///prefix: not an s3://bucket/prefix URL",
    ),
    "publish-endpoint-bad-host": (
        HEAD
        + "matrix:\n"
        + GOOD_AXES
        + "publish:\n  to: s3://bkt/p\n  endpoint_url: http://t0ken@mi_nio:9000 #<\n",
        "publish.endpoint_url http://mi_nio:9000: Invalid endpoint",
    ),
    "publish-endpoint": (
        HEAD + "matrix:\n" + GOOD_AXES + "publish:\n  to: ./index\n  endpoint_url: http://x #<\n",
        "publish.endpoint_url only applies to an s3:// destination",
    ),
    "compat-float-torch": (
        HEAD + 'compat:\n  torch:\n    2.15: {cuda: ["13.0"]} #<\nmatrix:\n' + GOOD_AXES,
        "compat.torch: 2.15 must be a quoted torch minor version",
    ),
    "compat-default-cuda": (
        HEAD + 'compat:\n  torch:\n    "2.9": {default_cuda: "cu128"} #<\nmatrix:\n' + GOOD_AXES,
        "compat.torch.2.9.default_cuda 'cu128' is not a version like 12.8",
    ),
    # values --check accepted that failed later, in a build or at publish
    "package-version-space": (
        'package:\n  name: flash-attn\n  version: "2.8.3 " #<\nmatrix:\n' + GOOD_AXES,
        "package.version '2.8.3 ' has spaces around it; write '2.8.3'",
    ),
    "cuda-leading-zero": (
        HEAD + "matrix:\n" + GOOD_AXES.replace('["13.0"]', '["12.08"] #<'),
        "cuda version '12.08' is not a version like 12.8",
    ),
    "torch-leading-zero": (
        HEAD + "matrix:\n" + GOOD_AXES.replace('["2.10"]', '["2.010"] #<'),
        "torch version '2.010' is not a version like 2.10",
    ),
    "cuda-trailing-newline": (
        HEAD + "matrix:\n" + GOOD_AXES.replace('["13.0"]', '["13.0\\n"] #<'),
        "cuda version '13.0\\n' is not a version like 12.8",
    ),
    "build-memory-tiny": (
        HEAD + "matrix:\n" + GOOD_AXES + "build:\n  memory: 1KiB #<\n",
        "build.memory 1024 bytes is below 1.0 GiB, too little for a container that compiles CUDA",
    ),
    "build-memory-budget-tiny": (
        HEAD + "matrix:\n" + GOOD_AXES + "build:\n  memory_budget: 1B #<\n",
        "build.memory_budget 1 bytes is below 1.0 GiB",
    ),
    "build-concurrency-huge": (
        HEAD + "matrix:\n" + GOOD_AXES + "build:\n  concurrency: 1000 #<\n",
        "build.concurrency 1000 is above 256",
    ),
    "build-concurrency-float": (
        HEAD + "matrix:\n" + GOOD_AXES + "build:\n  concurrency: 1e30 #<\n",
        "build.concurrency must be an integer",
    ),
    "build-concurrency-starves": (
        HEAD + "matrix:\n" + GOOD_AXES + "build:\n  memory_budget: 8GiB\n  concurrency: 16 #<\n",
        "build.concurrency 16 leaves each container 512 MiB of build.memory_budget, below 1.0 GiB",
    ),
    # without a budget, the host's: this machine has far less than 256 GiB of memory
    "build-concurrency-starves-the-host": (
        HEAD + "matrix:\n" + GOOD_AXES + "build:\n  concurrency: 256 #<\n",
        "of 3/4 of this host's memory, below 1.0 GiB; lower the concurrency",
    ),
    "build-memory-over-budget": (
        HEAD
        + "matrix:\n"
        + GOOD_AXES
        + "build:\n  memory: 4GiB\n  memory_budget: 8GiB\n  concurrency: 4 #<\n",
        "build: 4 containers x 4.0 GiB exceed the memory budget of 8.0 GiB",
    ),
    "publish-to-s3-nothing": (
        HEAD + "matrix:\n" + GOOD_AXES + 'publish:\n  to: "s3://" #<\n',
        "publish.to s3://: not an s3://bucket/prefix URL",
    ),
    "publish-to-s3-bracket": (
        HEAD + "matrix:\n" + GOOD_AXES + 'publish:\n  to: "s3://b[/p" #<\n',
        "publish.to s3://b[/p: not an s3://bucket/prefix URL (Invalid IPv6 URL)",
    ),
    "publish-to-http": (
        HEAD + "matrix:\n" + GOOD_AXES + 'publish:\n  to: "http://x" #<\n',
        "publish.to 'http://x': use a directory or s3://bucket/prefix",
    ),
    "publish-to-file": (
        HEAD + "matrix:\n" + GOOD_AXES + "publish:\n  to: /etc/passwd #<\n",
        "publish.to '/etc/passwd' exists and is not a directory",
    ),
    "compat-recipe-min-arch": (
        HEAD + "compat:\n  recipes:\n    r:\n      min_arch: banana #<\nmatrix:\n" + GOOD_AXES,
        "compat.recipes.r.min_arch 'banana'",
    ),
    "compat-recipe-cxx-std": (
        HEAD + "compat:\n  recipes:\n    r:\n      cxx_std: 98 #<\nmatrix:\n" + GOOD_AXES,
        "compat.recipes.r.cxx_std '98' must be one of 14, 17, 20, 23",
    ),
    "compat-cuda-versions": (
        HEAD + 'compat:\n  cuda_versions: ["13.0", "thirteen"] #<\nmatrix:\n' + GOOD_AXES,
        "compat.cuda_versions item 'thirteen' is not a version like 12.8",
    ),
    # what the host's pip is given: requirements, never options or URLs
    "requirement-index-option": (
        HEAD
        + 'recipe:\n  name: r\n  extra_build_requires: ["--index-url=http://evil/"] #<\nmatrix:\n'
        + GOOD_AXES,
        "recipe.extra_build_requires item '--index-url=http://evil/' is not a requirement like 'ninja>=1.11'",
    ),
    "requirement-file-option": (
        HEAD
        + 'recipe:\n  name: r\n  extra_build_requires:\n    - ninja\n    - "-r /etc/passwd" #<\nmatrix:\n'
        + GOOD_AXES,
        "recipe.extra_build_requires item '-r /etc/passwd' is not a requirement",
    ),
    "requirement-url": (
        HEAD
        + 'recipe:\n  name: r\n  extra_build_requires: ["x @ https://evil/x.whl"] #<\nmatrix:\n'
        + GOOD_AXES,
        "recipe.extra_build_requires item 'x @ https://evil/x.whl' is a direct URL",
    ),
    # paths stay inside the matrix file's directory (without --trust-paths)
    "patch-absolute-outside": (
        HEAD + "recipe:\n  name: r\n  patches:\n    - /etc/passwd #<\nmatrix:\n" + GOOD_AXES,
        "recipe.patches item '/etc/passwd' is outside the matrix file's directory",
    ),
    "patch-dotdot-outside": (
        HEAD + "recipe:\n  name: r\n  patches: [../../x.diff] #<\nmatrix:\n" + GOOD_AXES,
        "recipe.patches item '../../x.diff' is outside the matrix file's directory",
    ),
    "source-proc": (
        'package:\n  name: x\n  version: "1.0"\n  source: {path: /proc/self} #<\nmatrix:\n' + GOOD_AXES,
        "package.source.path '/proc/self' is outside the matrix file's directory",
    ),
    # bounds, said in the message
    "too-many-jobs": (
        HEAD
        + "matrix: #<\n"
        + "  cuda: [{}]\n".format(", ".join(f'"12.{i}"' for i in range(50)))
        + "  torch: [{}]\n".format(", ".join(f'"2.{i}"' for i in range(2000)))
        + "  python: [{}]\n".format(", ".join(f'"3.{i}"' for i in range(100)))
        + '  cxx11_abi: [true]\n  arch: ["8.0"]\n',
        "matrix: 50 cuda x 2000 torch x 100 python x 1 cxx11_abi x 1 arch make 10000000 jobs; at most 4096",
    ),
    "too-many-includes": (
        HEAD + "matrix:\n" + GOOD_AXES + "  include: #<\n" + "    - {env: {A: x}}\n" * 300,
        "matrix.include has 300 entries; at most 256",
    ),
    "nested-too-deep": (
        HEAD + "matrix:\n" + GOOD_AXES + "  include:\n    - {deep: " + "[" * 40 + "]" * 40 + "} #<\n",
        "nested more than 32 levels deep",
    ),
    "top-level-list": ("- a #<\n- b\n", "the top level must be a mapping, not a list"),
    "empty-file": ("#<\n", "the file is empty"),
    "no-axes": (HEAD + "matrix: {} #<\n", "matrix has no axes and no include entries"),
    "sha256-not-hex": (
        'package: {name: x, version: "1", sha256: abc} #<\nmatrix:\n' + GOOD_AXES,
        "package.sha256 'abc' is not a sha256 (64 hex digits)",
    ),
    "sha256-with-git": (
        'package:\n  name: x\n  version: "1"\n  source: {git: "https://h/x.git", ref: v1}\n'
        f"  sha256: {'0' * 64} #<\nmatrix:\n" + GOOD_AXES,
        "package.sha256 only goes with source: pypi",
    ),
    "max-download-not-a-size": (
        'package:\n  name: x\n  version: "1"\n  max_download: lots #<\nmatrix:\n' + GOOD_AXES,
        "package.max_download: size 'lots' is not a size like 16GiB",
    ),
    "platform-unknown": (
        HEAD + "matrix:\n" + GOOD_AXES + '  include:\n    - {python: "3.12", platform: arm} #<\n',
        "unknown platform 'arm': expected one of x86_64, aarch64",
    ),
    "download-deadline-negative": (
        'package:\n  name: x\n  version: "1"\n  download_deadline: -5 #<\nmatrix:\n' + GOOD_AXES,
        "package.download_deadline must be positive, not -5",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_malformed_input(
    case: str, tmp_path: Path, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    text, fragment = CASES[case]
    path = tmp_path / "m.yaml"
    path.write_text(text)
    line = next(i for i, t in enumerate(text.splitlines(), 1) if "#<" in t)
    code, output = factory_cli(["matrix", "--matrix", str(path), "--check"])
    assert code == 2, output
    assert "Traceback" not in output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith(f"error: {path}:{line}: "), output
    assert fragment in lines[0], output
    assert "t0ken" not in output
    assert len(lines[0]) < 400, lines[0]


def test_there_are_at_least_twenty_cases() -> None:
    assert len(CASES) >= 20


def test_missing_file(tmp_path: Path, factory_cli: Callable[[list[str]], tuple[int, str]]) -> None:
    missing = tmp_path / "nope.yaml"
    code, output = factory_cli(["matrix", "--matrix", str(missing)])
    assert code == 2
    assert output.strip() == f"error: {missing}: no such file"


def test_the_installed_console_script(tmp_path: Path) -> None:
    """The same contract through a real process, as a user runs it."""
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(CASES["unquoted-torch-floats"][0]))
    factory = Path(sys.executable).with_name("factory")
    cmd = [str(factory)] if factory.exists() else [sys.executable, "-m", "factory.cli"]
    proc = subprocess.run([*cmd, "matrix", "--matrix", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert proc.stderr.strip() == f'error: {path}:4: torch version 2.1 must be a quoted string (write "2.10")'
