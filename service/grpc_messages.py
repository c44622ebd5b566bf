"""The Open Inference Protocol's gRPC messages: the code generated from its .proto file that
ships inside ``tritonclient`` (``tritonclient.grpc.service_pb2``), imported here and nowhere
else in the service.

Generated modules are a package's implementation, not its documented API: a tritonclient
release may regenerate them with other protobuf or grpcio versions. pyproject.toml pins the
range, and ``tests/service/test_grpc_contract.py`` checks that the service, its methods (against
the generated servicer, ``service_pb2_grpc``) and every field :mod:`service.grpc_v2` reads or
writes (:data:`FIELDS`) still have the shape written here, so an upgrade that changes one fails
there, loudly, rather than on a client's request.

:func:`add_servicer` registers only the RPCs Kestrel answers (:data:`METHODS`), as the generated
``add_GRPCInferenceServiceServicer_to_server`` registers all of them: gRPC itself then answers
UNIMPLEMENTED for the others, without the generated stubs' error and traceback in the log.
"""

from __future__ import annotations

from typing import Any

import grpc
from tritonclient.grpc import service_pb2 as messages

__all__ = ["FIELDS", "METHODS", "SERVICE", "add_servicer", "messages"]

SERVICE = "inference.GRPCInferenceService"

#: The RPCs Kestrel answers: name → (request message, response message). The others (streaming,
#: model config and statistics, shared memory, trace and log settings) answer UNIMPLEMENTED.
METHODS: dict[str, tuple[str, str]] = {
    "ServerLive": ("ServerLiveRequest", "ServerLiveResponse"),
    "ServerReady": ("ServerReadyRequest", "ServerReadyResponse"),
    "ServerMetadata": ("ServerMetadataRequest", "ServerMetadataResponse"),
    "ModelMetadata": ("ModelMetadataRequest", "ModelMetadataResponse"),
    "ModelReady": ("ModelReadyRequest", "ModelReadyResponse"),
    "ModelInfer": ("ModelInferRequest", "ModelInferResponse"),
    "RepositoryIndex": ("RepositoryIndexRequest", "RepositoryIndexResponse"),
    "RepositoryModelLoad": ("RepositoryModelLoadRequest", "RepositoryModelLoadResponse"),
    "RepositoryModelUnload": ("RepositoryModelUnloadRequest", "RepositoryModelUnloadResponse"),
}

#: Every field read or written, by message (nested ones dotted): its type as the contract test
#: describes a protobuf field ("repeated " for a list, "map<…>" for a map, a message's name).
FIELDS: dict[str, dict[str, str]] = {
    "ServerLiveResponse": {"live": "bool"},
    "ServerReadyResponse": {"ready": "bool"},
    "ServerMetadataResponse": {
        "name": "string",
        "version": "string",
        "extensions": "repeated string",
    },
    "ModelMetadataRequest": {"name": "string", "version": "string"},
    "ModelMetadataResponse": {
        "name": "string",
        "versions": "repeated string",
        "platform": "string",
        "inputs": "repeated inference.ModelMetadataResponse.TensorMetadata",
        "outputs": "repeated inference.ModelMetadataResponse.TensorMetadata",
    },
    "ModelMetadataResponse.TensorMetadata": {
        "name": "string",
        "datatype": "string",
        "shape": "repeated int64",
    },
    "ModelReadyRequest": {"name": "string", "version": "string"},
    "ModelReadyResponse": {"ready": "bool"},
    "ModelInferRequest": {
        "model_name": "string",
        "model_version": "string",
        "id": "string",
        "parameters": "map<string, inference.InferParameter>",
        "inputs": "repeated inference.ModelInferRequest.InferInputTensor",
        "outputs": "repeated inference.ModelInferRequest.InferRequestedOutputTensor",
        "raw_input_contents": "repeated bytes",
    },
    "ModelInferRequest.InferInputTensor": {
        "name": "string",
        "datatype": "string",
        "shape": "repeated int64",
        "contents": "inference.InferTensorContents",
    },
    "ModelInferRequest.InferRequestedOutputTensor": {"name": "string"},
    "ModelInferResponse": {
        "model_name": "string",
        "model_version": "string",
        "id": "string",
        "outputs": "repeated inference.ModelInferResponse.InferOutputTensor",
        "raw_output_contents": "repeated bytes",
    },
    "ModelInferResponse.InferOutputTensor": {
        "name": "string",
        "datatype": "string",
        "shape": "repeated int64",
        "contents": "inference.InferTensorContents",
    },
    "InferTensorContents": {
        "bool_contents": "repeated bool",
        "int_contents": "repeated int32",
        "int64_contents": "repeated int64",
        "uint_contents": "repeated uint32",
        "uint64_contents": "repeated uint64",
        "fp32_contents": "repeated float",
        "fp64_contents": "repeated double",
        "bytes_contents": "repeated bytes",
    },
    "InferParameter": {
        "bool_param": "bool",
        "int64_param": "int64",
        "string_param": "string",
        "double_param": "double",
        "uint64_param": "uint64",
    },
    "RepositoryIndexRequest": {"ready": "bool"},
    "RepositoryIndexResponse": {"models": "repeated inference.RepositoryIndexResponse.ModelIndex"},
    "RepositoryIndexResponse.ModelIndex": {
        "name": "string",
        "version": "string",
        "state": "string",
        "reason": "string",
    },
    "RepositoryModelLoadRequest": {"model_name": "string"},
    "RepositoryModelUnloadRequest": {"model_name": "string"},
}


def handlers(servicer: Any) -> dict[str, grpc.RpcMethodHandler]:
    """The unary handlers of :data:`METHODS`, by RPC name, calling ``servicer``'s methods."""
    return {
        name: grpc.unary_unary_rpc_method_handler(
            getattr(servicer, name),
            request_deserializer=getattr(messages, request).FromString,
            response_serializer=getattr(messages, response).SerializeToString,
        )
        for name, (request, response) in METHODS.items()
    }


def add_servicer(servicer: Any, server: grpc.aio.Server) -> None:
    """Serve ``servicer``'s RPCs (one async method per name in :data:`METHODS`) on ``server``."""
    generic = grpc.method_handlers_generic_handler(SERVICE, handlers(servicer))
    server.add_generic_rpc_handlers((generic,))
