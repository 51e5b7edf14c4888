"""Modules imported on first use: ``kubeplane.lazy`` and the ``kubeplane.config`` package's names."""

from __future__ import annotations

import copy
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest

import kubeplane
from kubeplane import lazy

pytestmark = pytest.mark.unit

SRC = Path(kubeplane.__file__).parent.parent


@pytest.fixture
def fake_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module ``kp_lazy_probe`` on the path that counts how often it was executed."""
    (tmp_path / "kp_lazy_probe.py").write_text(
        "import time\nEXECUTED = [1]\ntime.sleep(0.2)  # long enough for other readers to come mid-import\n"
        "def answer():\n    return 42\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kp_lazy_probe", raising=False)
    yield "kp_lazy_probe"
    sys.modules.pop("kp_lazy_probe", None)


def test_a_lazy_module_is_imported_on_first_attribute_read(fake_module: str) -> None:
    probe = lazy.module(fake_module)
    assert fake_module not in sys.modules
    assert "not imported yet" in repr(probe)
    assert probe.answer() == 42
    assert isinstance(sys.modules[fake_module], types.ModuleType)
    assert "(imported)" in repr(probe)
    with pytest.raises(AttributeError, match="nothing_here"):
        probe.nothing_here  # noqa: B018


def test_attributes_set_on_the_proxy_are_set_on_the_module(fake_module: str) -> None:
    probe = lazy.module(fake_module)
    probe.answer = lambda: 7
    assert sys.modules[fake_module].answer() == 7
    del probe.answer
    assert not hasattr(sys.modules[fake_module], "answer")


def test_threads_reading_mid_import_get_one_fully_executed_module(fake_module: str) -> None:
    """The first reader starts the import; the others read while the module still executes (it
    is in ``sys.modules`` by then, without ``answer``): each waits for it and gets the answer."""
    probe = lazy.module(fake_module)
    answers: list[object] = []

    def read() -> None:
        try:
            answers.append(probe.answer())
        except AttributeError as exc:
            answers.append(exc)

    first = threading.Thread(target=read)
    first.start()
    deadline = time.monotonic() + 10
    while fake_module not in sys.modules:  # the first reader is executing the module
        assert time.monotonic() < deadline
        time.sleep(0.001)
    others = [threading.Thread(target=read) for _ in range(7)]
    for thread in others:
        thread.start()
    for thread in [first, *others]:
        thread.join(timeout=10)
    assert answers == [42] * 8
    assert sys.modules[fake_module].EXECUTED == [1]


def test_a_proxy_copied_or_asked_for_protocols_does_not_import(fake_module: str) -> None:
    probe = lazy.module(fake_module)
    assert not hasattr(probe, "__fspath__")
    assert copy.copy(probe) is probe and copy.deepcopy(probe) is probe
    # A proxy made without __init__ (as unpickling would): its slots are unset, and reading one is
    # an AttributeError, not a recursion through __getattr__.
    bare = object.__new__(type(probe))
    with pytest.raises(AttributeError):
        bare.answer  # noqa: B018
    assert fake_module not in sys.modules


def test_load_all_imports_every_module_a_proxy_was_made_for(fake_module: str) -> None:
    lazy.module(fake_module)
    lazy.load_all()
    assert sys.modules[fake_module].answer() == 42


def test_a_missing_module_fails_on_first_use() -> None:
    missing = lazy.module("kubeplane.no_such_module")
    with pytest.raises(ModuleNotFoundError, match=r"kubeplane\.no_such_module"):
        missing.anything  # noqa: B018


def _fresh(script: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(SRC)},
        timeout=60,
    ).stdout


def test_config_defaults_and_paths_come_without_the_models() -> None:
    out = _fresh(
        "import sys\n"
        "from kubeplane.config import defaults, paths\n"
        "print(sorted(m for m in ('pydantic', 'ruamel', 'kubeplane.config.models') if m in sys.modules))\n"
        "from kubeplane import config\n"
        "print(config.MachineConfig.__module__, config.models.Machine.__name__, 'pydantic' in sys.modules)\n"
    )
    assert out.splitlines() == ["[]", "kubeplane.config.document Machine True"]


def test_config_dir_lists_every_public_name_once_before_any_is_used() -> None:
    out = _fresh(
        "from kubeplane import config\n"
        "names = dir(config)\n"
        "print(len(names) == len(set(names)), set(config.__all__) <= set(names))\n"
        "config.load\n"
        "names = dir(config)\n"
        "print(len(names) == len(set(names)))\n"
    )
    assert out.split() == ["True", "True", "True"]


def test_config_names_and_unknown_attributes() -> None:
    from kubeplane import config
    from kubeplane.config import document

    assert config.load is document.load
    assert {"MachineConfig", "load", "defaults", "apply_patch"} <= set(dir(config))
    assert set(config.__all__) <= set(dir(config))
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        config.nope  # noqa: B018
    with pytest.raises(ImportError):
        from kubeplane.config import nope  # noqa: F401
