"""trustd on loopback: the machine token gets a CSR signed by the OS CA; a wrong token gets nothing."""

from __future__ import annotations

import asyncio

import pytest

from kubeplane import api, pki
from kubeplane.api import trustd

pytestmark = pytest.mark.integration


def test_trustd_signs_for_the_machine_token_and_refuses_a_wrong_one() -> None:
    os_ca = pki.new_ca("trustd test os ca")
    server_pair = pki.issue(ca=os_ca, common_name="cp1", ip_addresses=["127.0.0.1"], usages=["server"])
    credentials = api.Credentials(ca=os_ca.cert, cert=server_pair.cert, key=server_pair.key)

    async def scenario() -> None:
        server = trustd.TrustdServer(token="right.token", ca=os_ca, credentials=credentials)
        await server.start("127.0.0.1:0")
        target = f"127.0.0.1:{server.port}"
        key = pki.generate_key()
        csr = pki.new_csr(key=key, common_name="worker1", ip_addresses=["10.5.0.3"])
        try:
            with pytest.raises(trustd.TrustdError, match="refused the machine token"):
                await trustd.request_certificate(targets=[target], token="wrong", csr=csr, ca=os_ca.cert)
            # An unreachable target first is skipped over.
            crt = await trustd.request_certificate(
                targets=["127.0.0.1:1", target], token="right.token", csr=csr, ca=os_ca.cert
            )
        finally:
            await server.stop()
        info = pki.cert_info(crt)
        assert pki.is_issued_by(crt, os_ca.cert)
        assert info.subject_cn == "worker1"
        assert "10.5.0.3" in info.ip_addresses

    asyncio.run(scenario())


def test_trustd_endpoints_start_with_the_control_plane_endpoint_host() -> None:
    assert trustd.endpoints("https://10.5.0.1:6443", ["10.5.0.2", "10.5.0.1"]) == [
        "10.5.0.1:50001",
        "10.5.0.2:50001",
    ]
