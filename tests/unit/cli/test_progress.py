"""The one progress display: plain lines off a terminal (what tests and CI read), a live view on one."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from kubeplane import plan
from kubeplane.cli import progress

pytestmark = pytest.mark.unit

STEP = plan.Step("static-pod", "kube-apiserver", "10.5.0.2", "r/a:v1", "r/a:v2")


def test_plain_lines_for_every_event(capsys: pytest.CaptureFixture[str]) -> None:
    shown = progress.Display(live=False)
    shown.step_started(5, 14, STEP)
    shown.info("patched /cluster/apiServer/image = r/a:v2 on node 10.5.0.2 (mode immediate)")
    shown.step_finished(5, STEP, plan.CHANGED, 41.23)
    shown.step_started(6, 14, STEP)
    shown.step_finished(6, STEP, plan.SKIPPED, 0.2)
    shown.step_started(3, 0, plan.Step("toolchain", "build", "", "", "make", place="on this host"))
    shown.step_failed(3, STEP, RuntimeError("make exited with status 2"), 12.0)
    captured = capsys.readouterr()
    assert captured.out == ""  # progress is on stderr; stdout is the command's own output
    assert captured.err.splitlines() == [
        "[5/14] static-pod kube-apiserver on node 10.5.0.2: r/a:v2",
        " > patched /cluster/apiServer/image = r/a:v2 on node 10.5.0.2 (mode immediate)",
        " < done (41.2s)",
        "[6/14] static-pod kube-apiserver on node 10.5.0.2: r/a:v2",
        " < already at target, skipped (0.2s)",
        "[3] toolchain build on this host: make",
        " < FAILED (12.0s): make exited with status 2",
    ]


def test_repeated_wait_messages_are_throttled(capsys: pytest.CaptureFixture[str]) -> None:
    now = [0.0]
    shown = progress.Display(live=False, clock=lambda: now[0])
    for seconds in (0.0, 1.5, 3.0, 11.0):
        now[0] = seconds
        shown.retrying('config version mismatch: got "2", expected "3"')
    shown.retrying("pod is not Ready yet")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" ", 2)[2] for line in lines] == [
        'retrying error: config version mismatch: got "2", expected "3"',
        'retrying error: config version mismatch: got "2", expected "3"',
        "retrying error: pod is not Ready yet",
    ]


def test_the_live_view_keeps_one_line_per_finished_step_and_pauses_for_prompts() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    shown = progress.Display(console=console, live=True)
    shown.step_started(1, 2, STEP)
    shown.retrying("pod is not Ready yet")
    shown.info("patched the image")
    with shown.paused():
        console.file.write("confirm? [yes/no]: yes\n")
    shown.step_finished(1, STEP, plan.CHANGED, 3.0)
    shown.step_started(2, 2, STEP)
    shown.step_failed(2, STEP, RuntimeError("boom"), 1.0)
    shown.close()
    text = out.getvalue()
    assert "patched the image" in text and "confirm? [yes/no]: yes" in text
    assert "✓ [1/2] static-pod kube-apiserver on node 10.5.0.2: r/a:v2  done (3.0s)" in text
    assert "✗ [2/2] static-pod kube-apiserver on node 10.5.0.2: r/a:v2  FAILED (1.0s)" in text


def test_a_step_within_a_step_keeps_the_outer_headline_in_the_live_view() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    shown = progress.Display(console=console, live=True)
    outer = plan.Step("start", "registry", "", "", "http://10.5.0.1:6000")
    shown.step_started(4, 10, outer)
    shown.step_started(
        1, 0, plan.Step("image", "checkpointer-verify", "", "", "/cache", place="on this host")
    )
    shown.step_finished(1, STEP, plan.SKIPPED, 0.0)
    shown.step_finished(4, outer, plan.CHANGED, 2.0)
    shown.close()
    text = out.getvalue()
    assert "- [1] image checkpointer-verify on this host: /cache  already at target, skipped (0.0s)" in text
    assert "✓ [4/10] start registry cluster-wide: http://10.5.0.1:6000  done (2.0s)" in text
