"""The engine's door to Docker without a daemon: what the SDK raises becomes one `DockerError`, images come
back as `LocalImage`, and `connect` names a daemon that does not answer in one line."""

from __future__ import annotations

import ast
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker.errors
import pytest
import requests.exceptions

from factory.build import engine
from factory.core.errors import BuildError, DockerError, FactoryError


class FakeImage:
    def __init__(self, image_id: str, *, tags: list[str], labels: dict[str, str] | None) -> None:
        self.id = image_id
        self.tags = tags
        self.labels = labels
        self.attrs = {
            "Size": 123,
            "Created": "2026-01-01T00:00:00Z",
            "Config": {"Env": ["CUDA_VERSION=13.0.1"]},
        }


class Refused:
    """Any attribute is a call the daemon refuses."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __getattr__(self, name: str) -> Any:
        def call(*_args: object, **_kwargs: object) -> None:
            raise self.exc

        return call


class FakeImages:
    def __init__(self, images: dict[str, FakeImage]) -> None:
        self.images = images

    def get(self, name: str) -> FakeImage:
        if name not in self.images:
            raise docker.errors.ImageNotFound(f"No such image: {name}")
        return self.images[name]

    def list(self, filters: dict[str, str]) -> list[FakeImage]:
        return [i for i in self.images.values() if filters["label"] in (i.labels or {})]


class FakeClient:
    def __init__(self, **parts: Any) -> None:
        self.__dict__.update(parts)


def api_error(text: str) -> docker.errors.APIError:
    return docker.errors.APIError("500 Server Error", explanation=text)


def test_an_image_comes_back_as_the_factory_reads_it() -> None:
    image = FakeImage("sha256:" + "ab" * 32, tags=["factory-builder:x"], labels=None)
    client = FakeClient(images=FakeImages({"factory-builder:x": image}))
    found = engine.get_image(client, "factory-builder:x")
    assert found == engine.LocalImage(
        id="sha256:" + "ab" * 32,
        tags=("factory-builder:x",),
        labels={},
        env=("CUDA_VERSION=13.0.1",),
        size=123,
        created="2026-01-01T00:00:00Z",
    )
    assert found is not None and found.short_id == "ab" * 6
    assert engine.get_image(client, "missing:1") is None


def test_a_pulled_images_platform_is_its_configs_os_and_architecture() -> None:
    image = FakeImage("sha256:1", tags=["nvidia/cuda:12.8.1-devel-ubuntu22.04-aarch64"], labels=None)
    image.attrs.update({"Os": "linux", "Architecture": "arm64", "Variant": "v8"})
    found = engine.get_image(FakeClient(images=FakeImages({"n": image})), "n")
    assert found is not None and found.platform == "linux/arm64"  # `Platform.docker` of aarch64


class TaggingApi:
    def __init__(self, answer: bool) -> None:
        self.answer = answer
        self.calls: list[tuple[str, str, str]] = []

    def tag(self, image_id: str, repository: str, tag: str) -> bool:
        self.calls.append((image_id, repository, tag))
        return self.answer


def test_tagging_splits_the_name_at_its_tag_and_a_refusal_is_an_error() -> None:
    api = TaggingApi(True)
    engine.tag_image(FakeClient(api=api), "sha256:1", "localhost:5000/cuda:13.0-aarch64")
    assert api.calls == [("sha256:1", "localhost:5000/cuda", "13.0-aarch64")]
    with pytest.raises(DockerError, match="did not tag sha256:1 as r:t"):
        engine.tag_image(FakeClient(api=TaggingApi(False)), "sha256:1", "r:t")


def test_listing_keeps_the_labelled_images() -> None:
    images = {
        "a": FakeImage("sha256:1", tags=["a"], labels={engine.LABEL: "1"}),
        "b": FakeImage("sha256:2", tags=["b"], labels={}),
    }
    found = engine.list_images(FakeClient(images=FakeImages(images)), label=engine.LABEL)
    assert [i.tags for i in found] == [("a",)]


@pytest.mark.parametrize(
    "exc",
    [api_error("pull access denied"), requests.exceptions.ConnectionError("Connection aborted")],
)
def test_a_refused_request_is_one_docker_error(exc: BaseException) -> None:
    client = FakeClient(images=Refused(exc), api=Refused(exc), volumes=Refused(exc), containers=Refused(exc))
    calls = [
        lambda: engine.pull_image(client, "nvidia/cuda", tag="13.0-devel"),
        lambda: engine.remove_image(client, "sha256:1"),
        lambda: engine.tag_image(client, "sha256:1", "r:t-aarch64"),
        lambda: engine.get_image(client, "x:1"),
        lambda: engine.list_images(client, label=engine.LABEL),
        lambda: engine.image_layers(client, "sha256:1"),
        lambda: engine.import_image(client, iter([b""]), repository="r", tag="t", changes=[]),
        lambda: engine.volume_exists(client, "v"),
        lambda: engine.running_runs(client),
        lambda: engine.remove_containers(client, filters={}),
        lambda: engine.remove_stale_containers(client),
    ]
    for call in calls:
        with pytest.raises(DockerError) as raised:
            call()
        message = str(raised.value)
        assert "\n" not in message and type(exc).__name__ in message
        assert isinstance(raised.value, BuildError) and raised.value.exit_code == 1


def test_a_build_that_fails_mid_stream_is_a_docker_error(tmp_path: Path) -> None:
    def stream() -> Iterator[dict[str, str]]:
        yield {"stream": "Step 1/2 : FROM base\n"}
        raise requests.exceptions.ConnectionError("daemon went away")

    class Api:
        def build(self, **_kwargs: object) -> Iterator[dict[str, str]]:
            return stream()

    steps = engine.build_image(
        FakeClient(api=Api()), tmp_path, tag="t:1", buildargs={}, labels={}, network_mode="none"
    )
    assert next(steps) == {"stream": "Step 1/2 : FROM base\n"}
    with pytest.raises(DockerError, match=r"^building t:1 failed \(ConnectionError: daemon went away\)$"):
        next(steps)


def test_a_missing_volume_is_no_error() -> None:
    class Volumes:
        def get(self, name: str) -> None:
            raise docker.errors.NotFound(f"volume {name} not found")

    assert engine.volume_exists(FakeClient(volumes=Volumes()), "factory-work") is False


def test_running_runs_are_the_run_labels_of_running_containers() -> None:
    class Container:
        def __init__(self, labels: dict[str, str]) -> None:
            self.labels = labels

    class Containers:
        def list(self, filters: dict[str, str]) -> list[Container]:
            assert filters == {"label": engine.LABEL}
            return [Container({engine.RUN_LABEL: "r1"}), Container({engine.RUN_LABEL: ""}), Container({})]

    assert engine.running_runs(FakeClient(containers=Containers())) == {"r1"}


def test_a_short_container_refused_is_a_docker_error() -> None:
    client = FakeClient(containers=Refused(api_error("No such image: nope:1")))
    box = engine.Engine(client, labels={}, stop=threading.Event())
    with pytest.raises(DockerError, match=r"^a container of nope:1 \(sh -c true\) failed \(APIError: "):
        box.run_short("nope:1", ["sh", "-c", "true"], user="0:0", mounts={})


def test_a_daemon_that_does_not_answer_is_one_line() -> None:
    class Silent:
        def ping(self) -> None:
            raise requests.exceptions.ConnectionError(
                "('Connection aborted.', FileNotFoundError(2, 'No such file'))"
            )

    with pytest.raises(FactoryError) as raised:
        engine.connect(client_factory=Silent)
    assert isinstance(raised.value, DockerError)
    message = str(raised.value)
    assert message.startswith("cannot reach the Docker daemon (ConnectionError: ") and "\n" not in message
    assert message.endswith("is dockerd running?")


# What loading and validating a matrix file may import: the loader and what validation needs, nothing that
# builds, publishes or plans memory (stores, wheelcheck, wheelhouse, the memory planner, the container tree).
LOADER_MODULES = {
    "factory",
    "factory.core",
    "factory.core.errors",
    "factory.core.platforms",
    "factory.core.resources",
    "factory.core.storeurl",
    "factory.core.tags",
    "factory.core.units",
    "factory.core.urls",
    "factory.core.validate",
    "factory.core.variants",
    "factory.spec",
    "factory.spec.abi3",
    "factory.spec.compat",
    "factory.spec.config",
    "factory.spec.imageref",
    "factory.spec.matrix",
    "factory.spec.measured",
    "factory.spec.options",
    "factory.spec.recipes",
    "factory.spec.stable_abi",
    "factory.spec.yamlcheck",
    "factory.spec.yamlload",
}


def test_loading_a_matrix_file_imports_only_what_validation_needs() -> None:
    code = (
        "import sys; before = set(sys.modules)\n"
        "from pathlib import Path; from factory.spec.config import load_matrix_file\n"
        "load_matrix_file(Path('examples/demo.yaml'))\n"
        "new = set(sys.modules) - before\n"
        "print(sorted(m for m in new if m.split('.')[0] == 'factory'))\n"
        "print(sorted({m.split('.')[0] for m in new} - set(sys.stdlib_module_names) - {'factory'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=Path(engine.__file__).parents[2],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert ast.literal_eval(out[0]) == sorted(LOADER_MODULES)
    assert set(ast.literal_eval(out[1])) <= {"packaging", "ruamel"}  # no docker, psutil, boto3, rich


class StoppedContainer:
    """A build container the run's own stop kills (Ctrl-C removes it): docker's wait then says 137."""

    def __init__(self, stop: threading.Event, *, code: int) -> None:
        self.stop, self.code = stop, code
        self.attrs: dict[str, Any] = {"State": {"OOMKilled": False}}

    def start(self) -> None:
        self.stop.set()  # the signal arrives while it runs

    def logs(self, **_kwargs: object) -> Iterator[bytes]:
        return iter([b"[1/9] c++ a.cpp\n"])

    def stats(self, **_kwargs: object) -> Iterator[dict[str, object]]:
        return iter([])

    def wait(self, timeout: float) -> dict[str, int]:
        return {"StatusCode": self.code}

    def reload(self) -> None:
        pass

    def remove(self, force: bool) -> None:
        pass


@pytest.mark.parametrize("code", [137, 143])
def test_a_container_the_runs_stop_killed_is_an_interruption_not_its_exit_code(
    tmp_path: Path, code: int
) -> None:
    stop = threading.Event()

    class Containers:
        def create(self, *_args: object, **_kwargs: object) -> StoppedContainer:
            return StoppedContainer(stop, code=code)

    runner = engine.Engine(FakeClient(containers=Containers()), labels={}, stop=stop)
    spec = engine.ContainerSpec(
        image="i", command=("true",), env={}, mounts={}, user="1000", working_dir="/",
        limits=engine.Limits(memory_bytes=1 << 30, cpus=1.0, pids=64),
    )  # fmt: skip
    with pytest.raises(engine.Interrupted):
        runner.run(spec, log_path=tmp_path / "job.log")
    # a container that ended by itself, with no stop asked, gives its exit code
    stop.clear()

    class Plain(StoppedContainer):
        def start(self) -> None:
            pass

    class Containers2:
        def create(self, *_args: object, **_kwargs: object) -> StoppedContainer:
            return Plain(stop, code=code)

    plain = engine.Engine(FakeClient(containers=Containers2()), labels={}, stop=stop)
    assert plain.run(spec, log_path=tmp_path / "job.log").exit_code == code


def test_the_report_says_which_signal_interrupted_the_build() -> None:
    from factory.build.runner import interrupted_reason

    assert interrupted_reason(engine.Interrupted("SIGTERM")).startswith("interrupted by SIGTERM")
    assert interrupted_reason(KeyboardInterrupt()).startswith("interrupted by Ctrl-C")
    assert "did not fail" in interrupted_reason(KeyboardInterrupt())
