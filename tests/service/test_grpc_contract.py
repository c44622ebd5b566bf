"""The generated gRPC code inside tritonclient still has the shape service/grpc_messages.py was
written against. An upgrade of tritonclient (pinned in pyproject.toml) that regenerates it
differently fails here, naming what changed, before a client's request can."""

from __future__ import annotations

from typing import Any

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from tritonclient.grpc import service_pb2, service_pb2_grpc

from service import grpc_messages

_SCALARS = {
    FieldDescriptor.TYPE_BOOL: "bool",
    FieldDescriptor.TYPE_BYTES: "bytes",
    FieldDescriptor.TYPE_DOUBLE: "double",
    FieldDescriptor.TYPE_FLOAT: "float",
    FieldDescriptor.TYPE_INT32: "int32",
    FieldDescriptor.TYPE_INT64: "int64",
    FieldDescriptor.TYPE_STRING: "string",
    FieldDescriptor.TYPE_UINT32: "uint32",
    FieldDescriptor.TYPE_UINT64: "uint64",
}


def describe(field: FieldDescriptor) -> str:
    """A field's type as grpc_messages.FIELDS writes it."""
    message = field.message_type
    if message is not None and message.GetOptions().map_entry:
        key, value = (describe(message.fields_by_name[n]) for n in ("key", "value"))
        return f"map<{key}, {value}>"
    kind = message.full_name if message is not None else _SCALARS[field.type]
    return f"repeated {kind}" if field.is_repeated else kind


def _message(dotted: str) -> Any:
    holder: Any = service_pb2
    for part in dotted.split("."):
        holder = getattr(holder, part)
    return holder


@pytest.mark.parametrize("dotted", sorted(grpc_messages.FIELDS))
def test_every_field_used_has_the_shape_written(dotted: str) -> None:
    fields = _message(dotted).DESCRIPTOR.fields_by_name
    got = {name: describe(field) for name, field in fields.items()}
    expected = grpc_messages.FIELDS[dotted]
    changed = {n: got.get(n, "absent") for n, kind in expected.items() if got.get(n) != kind}
    assert not changed, f"{dotted}: fields changed shape (expected {expected})"


def test_the_service_and_its_methods_are_as_written() -> None:
    service = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert service.full_name == grpc_messages.SERVICE
    for name, (request, response) in grpc_messages.METHODS.items():
        method = service.methods_by_name.get(name)
        assert method is not None, f"the service lost {name}"
        assert not (method.client_streaming or method.server_streaming), name
        assert method.input_type.full_name == f"inference.{request}", name
        assert method.output_type.full_name == f"inference.{response}", name


class _Recorder:
    """A server that keeps the generic handlers registered on it."""

    def __init__(self) -> None:
        self.handlers: list[Any] = []

    def add_generic_rpc_handlers(self, handlers: Any) -> None:
        self.handlers.extend(handlers)

    def add_registered_method_handlers(self, service: str, handlers: Any) -> None:
        self.handlers.append(grpc.method_handlers_generic_handler(service, handlers))


class _Details(grpc.HandlerCallDetails):
    def __init__(self, method: str) -> None:
        self.method = method
        self.invocation_metadata = ()


def test_our_handlers_are_what_the_generated_servicer_registers() -> None:
    """The same method paths, each with the same request and response serialization as the
    generated ``add_GRPCInferenceServiceServicer_to_server`` gives them (what the generated
    client stub, tritonclient's, calls)."""
    generated, ours = _Recorder(), _Recorder()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(
        service_pb2_grpc.GRPCInferenceServiceServicer(), generated
    )
    grpc_messages.add_servicer(service_pb2_grpc.GRPCInferenceServiceServicer(), ours)
    for name in grpc_messages.METHODS:
        details = _Details(f"/{grpc_messages.SERVICE}/{name}")
        theirs = next(filter(None, (h.service(details) for h in generated.handlers)), None)
        mine = next(filter(None, (h.service(details) for h in ours.handlers)), None)
        assert theirs is not None, f"the generated servicer no longer registers {name}"
        assert mine is not None, name
        assert mine.request_deserializer == theirs.request_deserializer, name
        assert mine.response_serializer == theirs.response_serializer, name
        assert not (theirs.request_streaming or theirs.response_streaming), name
