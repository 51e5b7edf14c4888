"""Health reports name the image a pod waits for when it cannot be pulled."""

from __future__ import annotations

import pytest

from kubeplane.ops import health

pytestmark = pytest.mark.unit

MISSING = "k8s.gcr.io/kube-scheduler:v1.20.2-missing"


def _pod(*statuses: dict[str, object]) -> dict[str, object]:
    return {"status": {"phase": "Pending", "containerStatuses": list(statuses)}}


def test_a_container_that_cannot_pull_its_image_names_it() -> None:
    pod = _pod(
        {
            "image": MISSING,
            "state": {
                "waiting": {
                    "reason": "ErrImagePull",
                    "message": "rpc error: code = NotFound desc = failed to pull and unpack image "
                    f'"{MISSING}":\n not found',
                }
            },
        },
        {"image": "k8s.gcr.io/pause:3.2", "state": {"running": {}}},
    )
    assert health.image_problems(pod) == [
        f"image {MISSING} cannot be pulled (ErrImagePull: rpc error: code = NotFound desc = "
        f'failed to pull and unpack image "{MISSING}": not found)'
    ]


def test_back_off_and_init_containers_count_other_waits_do_not() -> None:
    pod = {
        "status": {
            "initContainerStatuses": [
                {"image": "busybox", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "x"}}}
            ],
            "containerStatuses": [
                {"image": MISSING, "state": {"waiting": {"reason": "ContainerCreating"}}},
                {"image": MISSING, "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "y"}}},
            ],
        }
    }
    assert health.image_problems(pod) == ["image busybox cannot be pulled (ImagePullBackOff: x)"]
    assert health.image_problems({}) == []
