"""The index's human page in a real browser (headless Chromium): loaded from a local index as a file and
over `factory serve`, choices made, the command shown is the one installcmd composes for that row. On a
failure the page's screenshot is saved under the test's tmp_path (its path printed)."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import require
from publish_helpers import chromium, selector_index

from factory.core.platforms import named
from factory.plan import variantrequest
from factory.publish import installcmd

pytestmark = pytest.mark.integration
FACTORY = str(Path(sys.executable).with_name("factory"))
VERSION = "2.8.3.post2"
AARCH64 = named("aarch64")


@pytest.fixture(scope="module")
def idx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return selector_index(tmp_path_factory.mktemp("selector"))


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        driver = chromium()
    except (RuntimeError, ImportError) as exc:
        require(False, f"headless Chromium ({exc})")
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module")
def served(idx: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("serve-log") / "serve.log"
    proc = subprocess.Popen(
        [FACTORY, "serve", str(idx), "--port", "0"], stdout=subprocess.PIPE, stderr=log.open("w"), text=True
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("serving "), line + log.read_text()
    try:
        yield line.split(" at ", 1)[1].strip().removesuffix("simple/")
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def screenshot_on_failure(browser: Any, tmp_path: Path) -> Iterator[None]:
    try:
        yield
    except BaseException:
        shot = tmp_path / "selector-failure.png"
        browser.save_screenshot(str(shot))
        print(f"screenshot of the page: {shot}")
        raise


def choose(browser: Any, **picks: str) -> None:
    """Set the picker's fields (select values, the GPU's text) as a person would."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    for field, value in picks.items():
        element = browser.find_element(By.ID, field)
        if element.tag_name == "select":
            Select(element).select_by_value(value)
        else:
            element.clear()
            element.send_keys(value)


def shown(browser: Any, element: str) -> str:
    from selenium.webdriver.common.by import By

    found = browser.find_element(By.ID, element)
    return str(found.text) if found.is_displayed() else ""


def expected(base: str, vid: str, label: str) -> tuple[str, str]:
    """installcmd's commands for the row, with the page's URL completing the variant index's."""
    install = installcmd.variant_install(
        "flash-attn", version=f"{VERSION}+{label}", variant_id=vid, variant_index=f"{base}simple/{vid}/"
    )
    assert install is not None
    return installcmd.commands(install)


CU130_214 = ("cu130-torch2.14-abi1-sm80.90.100.120", "cu13.0.torch2.14.abi1.sm80.90.100.120")
CU128_210 = ("cu128-torch2.10-abi1-sm80.90.100.120", "cu12.8.torch2.10.abi1.sm80.90.100.120")


def check_choices(browser: Any, base: str) -> None:
    # torch's CUDA 13.0, Python 3.12, an H100: the newest torch built for it
    choose(browser, cuda="t:13.0", python="3.12", gpu="H100")
    assert shown(browser, "verdict") == f"flash-attn: variant {CU130_214[0]}"
    assert (shown(browser, "pip"), shown(browser, "uv")) == expected(base, *CU130_214)
    assert shown(browser, "missing") == ""
    # a driver that runs CUDA 12.6 at most (no torch yet), an RTX 5090 by name: CUDA 12.8 by minor version
    # compatibility, said so
    choose(browser, cuda="d:12.6", python="3.11", gpu="RTX 5090")
    assert (shown(browser, "pip"), shown(browser, "uv")) == expected(base, *CU128_210)
    assert "runs by CUDA minor version compatibility" in shown(browser, "notes")
    # by compute capability
    choose(browser, cuda="", torch="2.10", python="3.13", gpu="sm_80")
    assert shown(browser, "pip") == expected(base, *CU128_210)[0]
    # torch 2.13 on Python 3.13 ran out of memory: nothing fits; what is missing and the matrix lines
    choose(browser, cuda="t:13.0", torch="2.13", python="3.13", gpu="H100")
    assert shown(browser, "commands") == ""
    assert shown(browser, "verdict") == (
        "No wheel fits: missing flash-attn for Python 3.13, CUDA 13.0, torch 2.13, cxx11 ABI 1, GPUs 9.0"
    )
    request = variantrequest.VariantRequest(
        package="flash-attn", python="3.13", cuda="13.0", torch="2.13", cxx11_abi=True, archs=("9.0",)
    )
    assert shown(browser, "lines") == "\n".join(variantrequest.matrix_lines(request))
    # a GPU no variant has code for (a V100): the nearest row and why
    choose(browser, torch="", python="3.12", gpu="V100")
    assert "no code for compute capability 7.0" in shown(browser, "notes")
    assert 'arch: "7.0"' in shown(browser, "lines")


def test_the_selector_from_a_directory(browser: Any, idx: Path, tmp_path: Path) -> None:
    browser.get((idx / "index.html").as_uri())
    with screenshot_on_failure(browser, tmp_path):
        check_choices(browser, idx.as_uri() + "/")


def test_an_arm_host_on_an_index_without_arm_wheels_gets_its_own_matrix_lines(
    browser: Any, idx: Path, tmp_path: Path
) -> None:
    """The index has x86_64 wheels only: picking aarch64 (a GH200) gives no x86_64 command but what is
    missing on aarch64 and the matrix lines that build it there, the lines `factory which` prints on such a
    host; picking x86_64 gives the command again."""
    browser.get((idx / "index.html").as_uri())
    with screenshot_on_failure(browser, tmp_path):
        choose(browser, platform="aarch64", cuda="t:13.0", python="3.12", gpu="GH200")
        assert shown(browser, "commands") == ""
        assert shown(browser, "verdict") == (
            "No wheel fits: missing flash-attn for Python 3.12 on aarch64, CUDA 13.0, torch 2.14, "
            "cxx11 ABI 1, GPUs 9.0"
        )
        assert "no wheel for Python 3.12 on aarch64" in shown(browser, "notes")
        request = variantrequest.make_request(
            package="flash-attn", python="3.12", cuda="13.0", torch="2.14", archs=["9.0"], platform=AARCH64
        )
        assert shown(browser, "lines") == "\n".join(variantrequest.matrix_lines(request))
        choose(browser, platform="x86_64")
        assert shown(browser, "verdict") == f"flash-attn: variant {CU130_214[0]} on x86_64"
        assert shown(browser, "missing") == ""


def test_the_selector_over_factory_serve_and_its_links(browser: Any, served: str, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    browser.get(served)
    with screenshot_on_failure(browser, tmp_path):
        check_choices(browser, served)
        # the grid: a failed job with its reason and its build record; each built wheel links to itself, its
        # signature and build record, and the links work
        text = browser.find_element(By.TAG_NAME, "table").text
        assert "failed: oom" in text and "not built" in text
        links = browser.find_elements(By.CSS_SELECTOR, "td.built a")
        hrefs = {a.text: a.get_attribute("href") for a in links[:3]}
        assert set(hrefs) == {links[0].text, "signature", "build"}
        wheel = hrefs[links[0].text]
        assert wheel.startswith(
            f"{served}files/cu128-torch2.10-abi1-sm80.90.100.120/flash_attn-"
        ) and wheel.endswith("-cp310-cp310-manylinux_2_28_x86_64.whl")
        assert hrefs["signature"] == wheel + ".sig.json" and hrefs["build"] == wheel + ".build.json"
        for href in hrefs.values():
            with urllib.request.urlopen(href, timeout=30) as answer:
                body = answer.read()
            assert answer.status == 200 and body
        with urllib.request.urlopen(hrefs["build"], timeout=30) as answer:
            assert json.load(answer)["wheel"]["filename"] == wheel.rsplit("/", 1)[1].replace("%2B", "+")
        # the failed job's build record, linked from its cell, is served too
        [failed] = browser.find_elements(By.CSS_SELECTOR, "td.failed a")
        assert failed.text == "build record" and failed.get_attribute("href").startswith(f"{served}_builds/")
        with urllib.request.urlopen(failed.get_attribute("href"), timeout=30) as answer:
            assert json.load(answer)["failed"]["result"] == "oom"


def test_without_javascript_the_grid_reads(browser: Any, idx: Path, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})
    try:
        browser.get((idx / "index.html").as_uri())
        with screenshot_on_failure(browser, tmp_path):
            assert not browser.find_element(By.ID, "pick").is_displayed()
            table = browser.find_element(By.TAG_NAME, "table")
            assert "built 20" in table.text and "failed: oom" in table.text
            browser.find_element(By.CSS_SELECTOR, "details summary").click()
            code = browser.find_element(By.CSS_SELECTOR, "details code").text
            assert code.startswith("pip install --only-binary flash-attn --index-url simple/cu128-torch2.10")
    finally:
        browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": False})


def test_a_pure_wheel_serves_every_python(browser: Any, tmp_path: Path) -> None:
    """A py3 wheel's column is no CPython: any Python picked takes it (and any platform)."""
    from publish_helpers import LABEL_NEW, VID_NEW, make_wheel

    from factory.publish.publisher import publish_wheels

    publish_wheels([make_wheel(tmp_path / "wh")], to=str(tmp_path / "idx"))
    browser.get((tmp_path / "idx" / "index.html").as_uri())
    with screenshot_on_failure(browser, tmp_path):
        choose(browser, gpu="A100")
        install = installcmd.variant_install(
            "tinyvar",
            version=f"0.1.0+{LABEL_NEW}",
            variant_id=VID_NEW,
            variant_index=f"{(tmp_path / 'idx').as_uri()}/simple/{VID_NEW}/",
        )
        assert install is not None
        assert (shown(browser, "pip"), shown(browser, "uv")) == installcmd.commands(install)
        choose(browser, gpu="RTX 4090")  # 8.9: sm_80 code runs on it (same major, later minor)
        assert shown(browser, "pip") == installcmd.pip_command(install)
        choose(browser, gpu="T4")
        assert shown(browser, "commands") == ""
        assert "no code for compute capability 7.5; built for 8.0, 9.0" in shown(browser, "notes")


def test_repair_rebuilds_the_same_page(tmp_path: Path) -> None:
    """What the grid says of each wheel (upload time, files beside it), rebuilt from the store alone."""
    from factory.publish.publisher import repair_index

    idx = selector_index(tmp_path)
    page, state = (idx / "index.html").read_bytes(), (idx / "matrix.json").read_bytes()
    (idx / "matrix.json").write_text('{"cells": []}\n')  # lost: repair finds what is beside each wheel
    repair_index(to=str(idx))
    assert (idx / "matrix.json").read_bytes() != state  # the failed and skipped cells came from the report
    rebuilt = json.loads((idx / "matrix.json").read_text())["cells"]
    published = {c["detail"]: c for c in json.loads(state)["cells"] if c["status"] == "built"}
    assert {c["detail"]: c for c in rebuilt} == published
    (idx / "matrix.json").write_bytes(state)
    repair_index(to=str(idx))
    assert (idx / "index.html").read_bytes() == page


def test_the_platform_is_shown_and_an_aarch64_pick_installs_the_aarch64_wheel(
    browser: Any, tmp_path: Path
) -> None:
    """One variant index lists flash-attn's x86_64 wheels and its aarch64 ones (an older release, and a
    failed aarch64 job): the grid has a row per platform saying which, and picking aarch64 (a GH200) gives
    the aarch64 row's commands, whose pin only the aarch64 wheel carries: real pip for an aarch64 host takes
    that file from the index, by that requirement."""
    from publish_helpers import make_wheel
    from selenium.webdriver.common.by import By

    from factory.publish.publisher import publish_wheels

    vid, label = CU130_214
    versions = {"x86_64": VERSION, "aarch64": "2.8.2"}
    wheels, jobs = {}, []
    for arch, version in versions.items():
        wheels[arch] = make_wheel(
            tmp_path / "wh", name="flash-attn", version=version, label=label,
            tag=f"cp311-cp311-manylinux_2_28_{arch}",
        )  # fmt: skip
        job = {"variant_id": vid, "python": "3.11", "result": "ok", "wheel": wheels[arch].name}
        jobs.append({**job, "job_id": f"{vid}-py311-{arch}", "platform": arch, "package": "flash-attn"})
    jobs.append({"job_id": f"{vid}-py312-aarch64", "variant_id": vid, "python": "3.12", "result": "oom",
                 "platform": "aarch64", "wheel": None, "package": "flash-attn"})  # fmt: skip
    jobs.append({"job_id": f"{vid}-py312", "variant_id": vid, "python": "3.12", "result": "ok", "wheel": None,
                 "package": "flash-attn"})  # fmt: skip
    report = tmp_path / "wh" / "report.json"
    report.write_text(json.dumps({"jobs": jobs}))
    publish_wheels(list(wheels.values()), to=str(tmp_path / "idx"), report=report)
    base = (tmp_path / "idx").as_uri() + "/"
    browser.get(base + "index.html")
    with screenshot_on_failure(browser, tmp_path):
        rows = [r.text for r in browser.find_elements(By.CSS_SELECTOR, "tr[data-w]")]
        assert [r.split()[:2] for r in rows] == [[vid, "x86_64"], [vid, "aarch64"]], rows
        assert "failed: oom" in rows[1] and "failed" not in rows[0]
        platforms = [
            o.get_attribute("value") for o in browser.find_elements(By.CSS_SELECTOR, "#platform option")
        ]
        assert platforms == ["", "aarch64", "x86_64"]
        commands = {}
        for arch, version in versions.items():
            choose(browser, platform=arch, python="3.11", gpu="GH200")
            assert shown(browser, "verdict") == f"flash-attn: variant {vid} on {arch}"
            install = installcmd.variant_install(
                "flash-attn",
                version=f"{version}+{label}",
                variant_id=vid,
                variant_index=f"{base}simple/{vid}/",
            )
            assert install is not None
            commands[arch] = (shown(browser, "pip"), shown(browser, "uv"))
            assert commands[arch] == installcmd.commands(install)
        assert commands["aarch64"] != commands["x86_64"]
        # no aarch64 wheel for Python 3.12 (its job ran out of memory): nothing fits, and the page says why
        choose(browser, platform="aarch64", python="3.12", gpu="GH200")
        assert shown(browser, "commands") == ""
        assert "no wheel for Python 3.12 on aarch64" in shown(browser, "notes")
        # ... and the matrix lines that build it build it for aarch64, as `factory which` on such a host says
        assert shown(browser, "verdict") == (
            "No wheel fits: missing flash-attn for Python 3.12 on aarch64, CUDA 13.0, torch 2.14, "
            "cxx11 ABI 1, GPUs 9.0"
        )
        request = variantrequest.make_request(
            package="flash-attn", python="3.12", cuda="13.0", torch="2.14", archs=["9.0"], platform=AARCH64
        )
        assert shown(browser, "lines") == "\n".join(variantrequest.matrix_lines(request))
        assert shown(browser, "lines").endswith(", platform: aarch64}")
    # the aarch64 command's requirement, from its variant index, on an aarch64 host: the aarch64 wheel
    pip = commands["aarch64"][0].split()
    requirement = pip[-1]
    index_url = pip[pip.index("--index-url") + 1]
    assert requirement == f"flash-attn=={versions['aarch64']}+{label}" and index_url == f"{base}simple/{vid}/"
    got = subprocess.run(
        [sys.executable, "-m", "pip", "--isolated", "--no-cache-dir", "download", "--no-deps",
         "--only-binary", ":all:", "--platform", "manylinux_2_28_aarch64", "--python-version", "3.11",
         "--implementation", "cp", "--abi", "cp311", "--index-url", index_url, "-d", str(tmp_path / "dl"),
         requirement],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert got.returncode == 0, got.stdout + got.stderr
    assert [p.name for p in (tmp_path / "dl").iterdir()] == [wheels["aarch64"].name]
