"""The agent's own reading of the interface addresses (an ioctl, no subprocess) lists what
``ip -4 addr`` lists, in the same order: the first one becomes the node IP when the agent listens
on a wildcard address."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from kubeplane.agent import node

pytestmark = pytest.mark.integration


def ip_addresses() -> list[str]:
    out = subprocess.run(
        ["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, check=True
    ).stdout
    return [
        info["local"]
        for link in json.loads(out)
        for info in link.get("addr_info", [])
        if not info["local"].startswith("127.")
    ]


@pytest.mark.skipif(shutil.which("ip") is None, reason="iproute2 is not installed")
def test_local_addresses_are_the_ones_ip_lists() -> None:
    # Other tests may add or remove interfaces meanwhile: compare while ip's answer holds still.
    for _ in range(10):
        before = ip_addresses()
        ours = node.local_addresses()
        if ip_addresses() == before:
            assert ours == before
            return
    pytest.fail("the interfaces kept changing; could not compare")
