"""Toolchain cache: versions, apt deb-src twins, stamp verification, rebuilds and step failures.

The pipeline runs for real against a tmp cache seeded with a tiny fake ``kubernetes`` source
package (a .dsc with correct checksums and an orig tarball holding pause.c), and a fake ``make``
that writes shell-script "binaries" printing their version, so no Go build and no network.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from kubeplane import plan
from kubeplane.cli import toolchain as cli_toolchain
from kubeplane.provision import steps, toolchain

pytestmark = pytest.mark.unit

SOURCE_VERSION = "1.20.5+really1.20.2-1.1+deb12u1"
PAUSE_C = (
    b"#include <stdio.h>\n#define STRINGIFY(x) #x\n#define S(x) STRINGIFY(x)\n"
    b"int main(void) { puts(S(VERSION)); return 0; }\n"
)
FAKE_MAKE = """#!/bin/sh
set -e
echo "make $*" >> "$FAKE_MAKE_RUNS"
echo "compiling with KUBE_GIT_VERSION_FILE=${KUBE_GIT_VERSION_FILE:-unset} \
CGO_ENABLED=$CGO_ENABLED GOFLAGS=$GOFLAGS"
# Like hack/lib/version.sh in an archived tree: the tag wins unless a version file is given.
KUBE_GIT_VERSION=v1.20.2
if [ -n "${KUBE_GIT_VERSION_FILE:-}" ]; then . "$KUBE_GIT_VERSION_FILE"; fi
mkdir -p _output/bin
for name in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
  printf '#!/bin/sh\\necho "Kubernetes %s"\\n' "$KUBE_GIT_VERSION" > _output/bin/$name
  chmod +x _output/bin/$name
done
# kubeadm: its default configs (the reflect2 check) and the images it asks for.
cat > _output/bin/kubeadm <<'KUBEADM'
#!/bin/sh
case "$*" in
  "config images list"*) echo k8s.gcr.io/etcd:3.4.13-0 ;;
  *) echo "kind: InitConfiguration" ;;
esac
KUBEADM
chmod +x _output/bin/kubeadm
"""
#: The lines of the generic API server that kubeplane's shutdown change touches.
GENERIC_APISERVER_GO = b"""package server

import (
	"net/http"
)

func (s preparedGenericAPIServer) NonBlockingRun(stopCh <-chan struct{}) (<-chan struct{}, error) {
		stoppedCh, err = s.SecureServingInfo.Serve(s.Handler, s.ShutdownTimeout, internalStopCh)
}
"""
FAILING_MAKE = """#!/bin/sh
echo "vendor/k8s.io/foo: cannot find package"
echo "make: *** [Makefile:93: all] Error 2"
exit 2
"""


def _tar_bytes(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _seed_source(cache: Path) -> None:
    debian = cache / "src" / "debian"
    debian.mkdir(parents=True)
    orig = "kubernetes_1.20.5+really1.20.2.orig.tar.gz"
    data = _tar_bytes(
        {
            "kubernetes-1.20.2/build/pause/linux/pause.c": PAUSE_C,
            "kubernetes-1.20.2/build/pause/Makefile": b"TAG = 3.4\nREV = $(shell git describe)\n",
            f"kubernetes-1.20.2/{toolchain.SHUTDOWN_PATCH_FILE}": GENERIC_APISERVER_GO,
        }
    )
    (debian / orig).write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    (debian / f"kubernetes_{SOURCE_VERSION}.dsc").write_text(
        f"Source: kubernetes\nVersion: {SOURCE_VERSION}\nChecksums-Sha256:\n {digest} {len(data)} {orig}\n"
    )


@pytest.fixture
def cache(tmp_path: Path) -> Path:
    root = tmp_path / "cache"
    _seed_source(root)
    return root


@pytest.fixture
def make_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    runs = tmp_path / "make-runs"
    runs.touch()
    monkeypatch.setenv("FAKE_MAKE_RUNS", str(runs))
    return runs


def _script(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o755)
    return path


def _toolchain(cache: Path, tmp_path: Path, make: str = FAKE_MAKE) -> toolchain.Toolchain:
    reflect2 = tmp_path / "reflect2"
    reflect2.mkdir(exist_ok=True)
    (reflect2 / "reflect2.go").write_text("package reflect2\n")
    (reflect2 / "go.mod").write_text("module github.com/modern-go/reflect2\n")
    return toolchain.Toolchain(
        cache,
        apt_dir=tmp_path / "no-apt",
        make_command=[str(_script(tmp_path, "fake-make", make))],
        reflect2_source=reflect2,
    )


@dataclasses.dataclass(frozen=True)
class Event:
    step: str
    state: str
    detail: str = ""


class Recorder:
    """The :class:`kubeplane.plan.Progress` events of the build, as (step, state, detail)."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def step_started(self, index: int, total: int, step: plan.Step) -> None:
        self.events.append(Event(step.component, "start", step.target))

    def info(self, message: str) -> None:
        name = self.events[-1].step if self.events else ""
        self.events.append(Event(name, "running", message))

    def retrying(self, message: str) -> None:
        raise AssertionError(f"the build has no waits: {message}")

    def step_finished(self, index: int, step: plan.Step, outcome: plan.Outcome, seconds: float) -> None:
        self.events.append(
            Event(step.component, "done" if outcome == plan.CHANGED else "cached", step.target)
        )

    def step_failed(self, index: int, step: plan.Step, cause: BaseException, seconds: float) -> None:
        self.events.append(Event(step.component, "failed", str(cause)))

    def states(self) -> dict[str, str]:
        return {event.step: event.state for event in self.events}


def test_version_strings() -> None:
    assert toolchain.parse_version("v1.20.2") == "1.20.2"
    assert toolchain.parse_version("v1.20.2-kp.1") == "1.20.2"
    for bad in ("1.20.2", "v1.20", "v1.20.2-", "v1.20.2/../x", "latest"):
        with pytest.raises(toolchain.ToolchainError, match="invalid Kubernetes version"):
            toolchain.parse_version(bad)
    assert toolchain.upstream_of(SOURCE_VERSION) == "1.20.2"
    assert toolchain.upstream_of("1:1.22.0-3") == "1.22.0"


def test_first_ensure_builds_everything_and_second_only_verifies(
    cache: Path, tmp_path: Path, make_runs: Path
) -> None:
    tc = _toolchain(cache, tmp_path)
    first = Recorder()
    paths = tc.ensure("v1.20.2", progress=first)
    assert first.states() == {
        "verify": "done",
        "fetch": "cached",
        "unpack": "done",
        "build": "done",
        "pause": "done",
        "images": "done",
        "kubeadm images": "done",
    }
    assert paths.root == cache / "kubernetes" / "v1.20.2"
    for name, path in {**paths.binaries, **paths.images, **paths.kubeadm_images}.items():
        assert path.is_file(), name
    assert list(paths.kubeadm_images) == ["k8s.gcr.io/etcd:3.4.13-0"]
    stamp = json.loads(paths.stamp.read_text())
    assert stamp["version"] == "v1.20.2" and stamp["source_package"] == SOURCE_VERSION
    assert sorted(stamp["artifacts"]) == sorted(toolchain.expected_artifacts("v1.20.2"))
    # The tree's vendored reflect2 is Debian's (the .go files, never its go.mod).
    vendored = cache / "src" / "kubernetes-1.20.2" / toolchain.REFLECT2_VENDOR
    assert sorted(p.name for p in vendored.iterdir()) == ["reflect2.go"]
    # The API server it builds tells clients to reconnect from the start of a graceful shutdown.
    patched = (cache / "src" / "kubernetes-1.20.2" / toolchain.SHUTDOWN_PATCH_FILE).read_text()
    assert "Serve(closeOnShutdown(s.Handler, s.readinessStopCh), s.ShutdownTimeout" in patched
    assert 'w.Header().Set("Connection", "close")' in patched
    assert stamp["artifacts"]["bin/kubelet"]["sha256"] == toolchain.sha256_file(paths.binary("kubelet"))
    build_log = (cache / "logs" / "v1.20.2" / "build.log").read_text()
    # Built without dockershim: no kubelet start waits 5 s for a docker daemon.
    assert "KUBE_GIT_VERSION_FILE=unset CGO_ENABLED=0 GOFLAGS=-tags=dockerless" in build_log

    second = Recorder()
    assert tc.ensure("v1.20.2", progress=second) == paths
    assert second.states() == {"verify": "done"}
    assert len(make_runs.read_text().splitlines()) == 1
    assert tc.require("v1.20.2") == paths
    assert tc.status("v1.20.2")["complete"] is True


def test_corrupt_image_is_repacked_without_rebuilding(cache: Path, tmp_path: Path, make_runs: Path) -> None:
    tc = _toolchain(cache, tmp_path)
    paths = tc.ensure("v1.20.2")
    good = paths.image("kube-scheduler").read_bytes()
    paths.image("kube-scheduler").write_bytes(good[:1000])
    assert tc.status("v1.20.2")["missing"] == ["images/kube-scheduler.tar"]
    with pytest.raises(toolchain.ToolchainError, match=r"kube-scheduler.tar.*kubeplane toolchain build"):
        tc.require("v1.20.2")
    events = Recorder()
    tc.ensure("v1.20.2", progress=events)
    assert events.states()["build"] == "cached"
    assert [e.detail for e in events.events if e.step == "images" and e.state == "start"] == [
        "kube-scheduler"
    ]
    assert paths.image("kube-scheduler").read_bytes() == good
    assert len(make_runs.read_text().splitlines()) == 1


def test_corrupt_binary_or_foreign_stamp_triggers_a_rebuild(
    cache: Path, tmp_path: Path, make_runs: Path
) -> None:
    tc = _toolchain(cache, tmp_path)
    paths = tc.ensure("v1.20.2")
    paths.binary("kube-apiserver").write_text("#!/bin/sh\necho tampered\n")
    events = Recorder()
    tc.ensure("v1.20.2", progress=events)
    assert events.states()["build"] == "done"
    assert "tampered" not in paths.binary("kube-apiserver").read_text()
    assert len(make_runs.read_text().splitlines()) == 2

    stamp = json.loads(paths.stamp.read_text())
    stamp["version"] = "v9.9.9"
    paths.stamp.write_text(json.dumps(stamp))
    events = Recorder()
    tc.ensure("v1.20.2", progress=events)
    assert events.states()["build"] == "done" and events.states()["pause"] == "done"
    assert len(make_runs.read_text().splitlines()) == 3


def test_suffixed_version_is_a_distinct_build(cache: Path, tmp_path: Path, make_runs: Path) -> None:
    tc = _toolchain(cache, tmp_path)
    plain = tc.ensure("v1.20.2")
    custom = tc.ensure("v1.20.2-kp.1")
    assert custom.root == cache / "kubernetes" / "v1.20.2-kp.1" != plain.root
    assert "KUBE_GIT_VERSION_FILE=/" in (cache / "logs" / "v1.20.2-kp.1" / "build.log").read_text()
    assert "Kubernetes v1.20.2-kp.1" in custom.binary("kube-apiserver").read_text()
    assert '"Kubernetes v1.20.2"' in plain.binary("kube-apiserver").read_text()
    assert tc.versions() == ["v1.20.2", "v1.20.2-kp.1"]
    # The tree both builds share carries the shutdown change once.
    patched = (cache / "src" / "kubernetes-1.20.2" / toolchain.SHUTDOWN_PATCH_FILE).read_text()
    assert patched.count(toolchain.SHUTDOWN_PATCH_MARKER) == 1
    assert patched.count("closeOnShutdown(") == 2  # its definition and the one call


def test_a_build_from_before_the_shutdown_change_is_rebuilt(
    cache: Path, tmp_path: Path, make_runs: Path
) -> None:
    tc = _toolchain(cache, tmp_path)
    paths = tc.ensure("v1.20.2")
    stamp = json.loads(paths.stamp.read_text())
    stamp["format"] = 3
    paths.stamp.write_text(json.dumps(stamp))
    events = Recorder()
    tc.ensure("v1.20.2", progress=events)
    assert events.states()["build"] == "done"
    assert len(make_runs.read_text().splitlines()) == 2


def test_an_earlier_form_of_the_shutdown_change_is_replaced_once(tmp_path: Path) -> None:
    source = tmp_path / toolchain.SHUTDOWN_PATCH_FILE
    source.parent.mkdir(parents=True)
    source.write_bytes(GENERIC_APISERVER_GO)
    toolchain.patch_shutdown_close(tmp_path)
    current = source.read_text()
    assert current.count(toolchain.SHUTDOWN_PATCH_MARKER) == 1 and "req.ProtoMajor == 1" in current
    toolchain.patch_shutdown_close(tmp_path)
    assert source.read_text() == current
    # A cached tree patched by an earlier build, with another body after the marker.
    earlier = current[: current.index(toolchain.SHUTDOWN_PATCH_MARKER)] + toolchain.SHUTDOWN_PATCH_MARKER
    source.write_text(earlier + "\nfunc closeOnShutdown() {}\n")
    toolchain.patch_shutdown_close(tmp_path)
    assert source.read_text() == current
    # One whose call passed other arguments.
    call = "closeOnShutdown(s.Handler, s.readinessStopCh)"
    other_call = earlier.replace(call, "closeOnShutdown(s.Handler, x)")
    assert other_call != earlier
    source.write_text(other_call + "\nfunc closeOnShutdown() {}\n")
    toolchain.patch_shutdown_close(tmp_path)
    assert source.read_text() == current


def test_a_tree_the_shutdown_change_does_not_fit_stops_the_build_naming_the_file(tmp_path: Path) -> None:
    source = tmp_path / toolchain.SHUTDOWN_PATCH_FILE
    source.parent.mkdir(parents=True)
    source.write_bytes(GENERIC_APISERVER_GO.replace(b"s.Handler, s.ShutdownTimeout", b"handler, timeout"))
    with pytest.raises(steps.StepFailed, match=r"genericapiserver\.go does not serve through") as failed:
        toolchain.patch_shutdown_close(tmp_path)
    assert failed.value.step == "build"
    assert toolchain.SHUTDOWN_PATCH_MARKER not in source.read_text()
    source.unlink()
    with pytest.raises(steps.StepFailed, match=r"cannot read .*genericapiserver\.go"):
        toolchain.patch_shutdown_close(tmp_path)


def test_failing_build_names_step_and_log(cache: Path, tmp_path: Path, make_runs: Path) -> None:
    tc = _toolchain(cache, tmp_path, make=FAILING_MAKE)
    events = Recorder()
    with pytest.raises(steps.StepFailed) as caught:
        tc.ensure("v1.20.2", progress=events)
    error = caught.value
    log = cache / "logs" / "v1.20.2" / "build.log"
    assert error.step == "build" and error.log == log
    message = str(error)
    assert message.startswith("step 'build' failed:") and "exited with status 2" in message
    assert "Makefile:93: all] Error 2" in message and f"full log: {log}" in message
    assert events.states()["build"] == "failed"
    assert not (cache / "kubernetes" / "v1.20.2" / "bin" / "kube-apiserver").exists()


def test_cli_build_failure_exits_1_naming_the_step(
    cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_runs: Path
) -> None:
    _script(tmp_path, "make", FAILING_MAKE)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    result = CliRunner().invoke(cli_toolchain.group, ["build", "--cache", str(cache)])
    assert result.exit_code == 1
    assert "toolchain build v1.20.2: step 'build' failed" in result.output
    assert "build.log" in result.output


def test_wrong_upstream_version_fails_at_fetch(cache: Path, tmp_path: Path, make_runs: Path) -> None:
    with pytest.raises(steps.StepFailed, match=r"'fetch'.*cannot build v1.21.0.*v1.20.2-SUFFIX"):
        _toolchain(cache, tmp_path).ensure("v1.21.0")


def test_cli_show_lists_versions_as_json(cache: Path, tmp_path: Path, make_runs: Path) -> None:
    _toolchain(cache, tmp_path).ensure("v1.20.2")
    result = CliRunner().invoke(cli_toolchain.group, ["show", "--cache", str(cache), "-o", "json"])
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.output)
    assert entry["version"] == "v1.20.2" and entry["complete"] is True
    assert entry["images"]["k8s.gcr.io/pause:3.2"] == str(cache / "kubernetes/v1.20.2/images/pause.tar")


def test_deb_src_twins_every_deb_entry(tmp_path: Path) -> None:
    parts = tmp_path / "sources.list.d"
    parts.mkdir()
    (parts / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://deb.example/debian\nSuites: bookworm bookworm-updates\n"
        "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n"
        "Types: deb\nURIs: http://off.example\nSuites: bookworm\nComponents: main\nEnabled: no\n"
    )
    (tmp_path / "sources.list").write_text(
        "deb [signed-by=/k.gpg arch=amd64] http://sec.example/sec bookworm-security main contrib\n"
        "# deb http://commented.example bookworm main\n"
    )
    assert toolchain.ensure_deb_src(tmp_path) is True
    text = (parts / toolchain.DEB_SRC_FILE).read_text()
    assert "URIs: http://deb.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n" in text
    assert "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg" in text
    assert "URIs: http://sec.example/sec\nSuites: bookworm-security\nComponents: main contrib\n" in text
    assert "Signed-By: /k.gpg" in text
    assert "off.example" not in text and "commented.example" not in text
    assert text.count("Types: deb-src") == 2
    assert toolchain.ensure_deb_src(tmp_path) is False


def test_no_deb_entry_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(steps.StepError, match="no enabled 'deb' entry"):
        toolchain.ensure_deb_src(tmp_path)


def test_error_inside_a_step_is_reported_with_traceback_in_its_log(tmp_path: Path) -> None:
    events = Recorder()
    runner = steps.Steps(tmp_path / "logs", events, kind="toolchain")
    with pytest.raises(steps.StepFailed) as caught, runner.step("images"):
        raise KeyError("kube-proxy")
    assert caught.value.step == "images" and caught.value.log == tmp_path / "logs" / "images.log"
    assert "Traceback" in (tmp_path / "logs" / "images.log").read_text()
    assert [e.state for e in events.events] == ["start", "failed"]
    with pytest.raises(steps.StepError, match="outside a step"):
        runner.run(["true"])


def test_missing_command_is_a_step_failure(tmp_path: Path) -> None:
    runner = steps.Steps(tmp_path / "logs", kind="toolchain")
    failure = r"step 'fetch' failed: cannot run 'no-such-apt-get'"
    with pytest.raises(steps.StepFailed, match=failure), runner.step("fetch"):
        runner.run(["no-such-apt-get", "source"])


def test_cli_rejects_a_bad_version_before_building_anything(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli_toolchain.group,
        ["build", "--cache", str(tmp_path / "c"), "--version", "v1.20.2", "--version", "1.20"],
    )
    assert result.exit_code == 1
    assert "--version: invalid Kubernetes version '1.20'" in result.output
    assert not (tmp_path / "c").exists()


def test_source_tree_is_the_one_a_build_unpacked(cache: Path, tmp_path: Path, make_runs: Path) -> None:
    tc = _toolchain(cache, tmp_path)
    with pytest.raises(toolchain.ToolchainError, match="no unpacked Kubernetes source tree"):
        tc.source_tree()
    tc.ensure("v1.20.2")
    tree = tc.source_tree()
    assert tree == toolchain.SourceTree(cache / "src" / "kubernetes-1.20.2", SOURCE_VERSION)
    assert (tree.path / "build" / "pause" / "linux" / "pause.c").is_file()


def test_go_build_is_the_makefiles_build_in_gopath_mode(tmp_path: Path) -> None:
    tree = tmp_path / "kubernetes-1.20.2"
    tree.mkdir()
    build = toolchain.go_build(tree, "test/images/agnhost", tmp_path / "out" / "agnhost", home=tmp_path)
    gopath = tree / "_output" / "local" / "go"
    # Inside GOPATH through the link the Makefile makes, so vendor/ applies and nothing is fetched.
    assert build.cwd == gopath / "src" / "k8s.io" / "kubernetes" and build.cwd.resolve() == tree
    assert build.env["PWD"] == str(build.cwd)
    assert build.env["GO111MODULE"] == "off" and build.env["CGO_ENABLED"] == "0"
    assert build.env["GOPATH"] == str(gopath) and build.env["GOCACHE"] == str(gopath / "cache")
    assert build.argv[0] == str(toolchain.GO_BIN / "go") and build.argv[1] == "build"
    # hack/lib/golang.sh's flags: the Kubernetes build's compiled packages are cache hits.
    flags = dict(zip(build.argv[2:-1:2], build.argv[3:-1:2], strict=True))
    assert flags == {
        "-gcflags": f"-trimpath={tree}",
        "-asmflags": f"-trimpath={tree}",
        "-ldflags": "-s -w -buildid=",
        "-tags": "selinux,notest",
        "-o": str(tmp_path / "out" / "agnhost"),
    }
    assert build.argv[-1] == "./test/images/agnhost"
    # An existing link (make's) is kept.
    assert toolchain.go_build(tree, "x", tmp_path / "y", home=tmp_path).cwd == build.cwd


def test_an_etcd_tag_kubeadm_does_not_ask_for_fails_the_build_naming_the_table(
    cache: Path, tmp_path: Path, make_runs: Path
) -> None:
    make = FAKE_MAKE.replace("k8s.gcr.io/etcd:3.4.13-0", "k8s.gcr.io/etcd:3.4.99-0")
    with pytest.raises(steps.StepFailed, match="kubeadm images") as failed:
        _toolchain(cache, tmp_path, make).ensure("v1.20.2")
    assert "KUBEADM_ETCD_TAGS" in str(failed.value) or "KUBEADM_ETCD_TAGS" in failed.value.log.read_text()


def test_a_missing_debian_reflect2_stops_the_build_naming_the_package(cache: Path, tmp_path: Path) -> None:
    tc = toolchain.Toolchain(cache, apt_dir=tmp_path / "no-apt", reflect2_source=tmp_path / "none")
    with pytest.raises(steps.StepFailed, match="golang-github-modern-go-reflect2-dev"):
        tc.ensure("v1.20.2")
