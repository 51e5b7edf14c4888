"""Acceptance: a generic gRPC client finds the node API through server reflection and calls it, as
grpcurl would, with an admin certificate and nothing of kubeplane's generated code.

The client builds its own descriptor pool from what the agent's reflection service sends
(grpcio-reflection's ProtoReflectionDescriptorDatabase) and its message classes from that pool
(protobuf's message_factory), and speaks to a real ``kubeplaned`` on a machine node.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from agent_harness import API_PORT, Agent, Cluster
from google.protobuf import descriptor_pool, json_format, message_factory
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from kubeplane.config import client as client_config
from kubeplane.resources import catalog

pytestmark = pytest.mark.integration

SERVICE = "kubeplane.node.v1.Machine"
REFLECTION = "grpc.reflection.v1alpha.ServerReflection"
TIMEOUT = 15.0


@pytest.fixture
def booted(cluster: Cluster) -> Agent:
    return cluster.boot_agent()


def admin_channel(cluster: Cluster, agent: Agent) -> grpc.Channel:
    """A plain synchronous grpc channel with the admin certificate of the generated client config."""
    _, context = client_config.current(client_config.load(cluster.admin))
    credentials = grpc.ssl_channel_credentials(
        root_certificates=context.ca_pem,
        private_key=context.client.key,
        certificate_chain=context.client.cert,
    )
    return grpc.secure_channel(f"{agent.address}:{API_PORT}", credentials)


class Generic:
    """What grpcurl does: descriptors from reflection, messages from JSON, answers to JSON."""

    def __init__(self, channel: grpc.Channel) -> None:
        self.channel = channel
        self.database = ProtoReflectionDescriptorDatabase(channel)
        self.pool = descriptor_pool.DescriptorPool(self.database)

    def services(self) -> list[str]:
        return list(self.database.get_services())

    def call(self, method: str, request: dict[str, Any]) -> dict[str, Any]:
        service_name, _, name = method.rpartition(".")
        found = self.pool.FindServiceByName(service_name).methods_by_name[name]
        request_class = message_factory.GetMessageClass(found.input_type)
        response_class = message_factory.GetMessageClass(found.output_type)
        # The classes come from this client's own pool, not from the project's generated modules.
        assert request_class.DESCRIPTOR.file.pool is self.pool
        rpc = self.channel.unary_unary(
            f"/{service_name}/{name}",
            request_serializer=lambda message: message.SerializeToString(),
            response_deserializer=response_class.FromString,
        )
        answer = rpc(json_format.ParseDict(request, request_class()), timeout=TIMEOUT)
        return json_format.MessageToDict(answer, preserving_proto_field_name=True)


@pytest.fixture
def generic(cluster: Cluster, booted: Agent) -> Iterator[Generic]:
    channel = admin_channel(cluster, booted)
    try:
        yield Generic(channel)
    finally:
        channel.close()


def test_a_reflection_client_lists_the_node_api_and_calls_its_read_methods(
    booted: Agent, generic: Generic
) -> None:
    services = generic.services()
    assert SERVICE in services and REFLECTION in services, services
    methods = {method.name for method in generic.pool.FindServiceByName(SERVICE).methods}
    assert {"Version", "ResourceGet", "ResourceList", "ResourceWatch", "ApplyConfiguration"} <= methods

    version = generic.call(f"{SERVICE}.Version", {})
    (reply,) = version["replies"]
    assert reply["node"] == booted.address
    result = json.loads(reply["result_json"])
    assert result["node"] == booted.address and result["maintenance"] is False, result

    request = {"type": catalog.MACHINE_TYPES, "id": catalog.MACHINE_TYPE_ID}
    got = generic.call(f"{SERVICE}.ResourceGet", request)
    (reply,) = got["replies"]
    resource = json.loads(reply["result_json"])
    assert resource["metadata"]["id"] == catalog.MACHINE_TYPE_ID, resource


def test_a_reflection_client_gets_the_node_api_errors_naming_the_field(generic: Generic) -> None:
    with pytest.raises(grpc.RpcError) as missing:
        generic.call(f"{SERVICE}.ResourceGet", {"type": catalog.MACHINE_TYPES})
    error: Any = missing.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "id: required" in error.details()
    trailing = dict(error.trailing_metadata())
    assert trailing["kubeplane-origin"] == "node"
    assert json.loads(trailing["kubeplane-fields"]) == [["id", "required"]]

    with pytest.raises(grpc.RpcError) as not_found:
        generic.call(f"{SERVICE}.ResourceGet", {"type": catalog.MACHINE_TYPES, "id": "nope"})
    error = not_found.value
    assert error.code() == grpc.StatusCode.NOT_FOUND and "nope" in error.details()
