"""The Open Inference Protocol v2 over gRPC (``inference.GRPCInferenceService``), so that
Triton's unmodified ``tritonclient.grpc`` scores Kestrel's models.

It runs in the HTTP application's process and event loop (started and stopped by its lifespan),
on ``KESTREL_GRPC_PORT``, and answers from the same implementation as the HTTP v2 routes
(:mod:`service.oip`) on the same batchers; each call passes the same admission, tokens and
metrics as an HTTP request (:mod:`service.grpc_calls`). Messages larger than
``KESTREL_MAX_BODY_BYTES`` are refused by gRPC itself (RESOURCE_EXHAUSTED).

ModelInfer reads ``raw_input_contents`` (little-endian; BYTES elements each prefixed by a 4-byte
length) or the typed ``contents`` of each input, and answers in ``raw_output_contents`` when the
request came raw (as tritonclient sends it), else in typed contents. Parameters: ``timeout``
(microseconds) is a deadline, as is the call's gRPC deadline (the earlier wins);
``strict_columns`` (bool) decides as the HTTP query parameter does; metadata
``x-kestrel-route-key`` picks the version where traffic is split. The columns a model does not
read are named in the answer's parameter ``kestrel_ignored_columns``. A ``contributions``
output's parameters ``columns`` (and ``outputs``, one per class) are JSON lists in strings.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np

from service import codecs, oip
from service.admission import Admission
from service.errors import BadRequest
from service.grpc_calls import Call, Calls, metadata_value, model_call
from service.grpc_messages import add_servicer, messages
from service.models import ModelManager
from service.parity import side_by_side
from service.scoring import CONTRIBUTIONS
from service.settings import Settings
from service.versions import SERVABLE, Prediction
from service.web import ROUTE_KEY_HEADER

log = logging.getLogger("kestrel.grpc")

IGNORED_COLUMNS = "kestrel_ignored_columns"
#: In-flight calls may finish this long once the server stops, before the batchers close.
STOP_GRACE_S = 10.0

# Each datatype's typed contents field (FP16 has none: raw contents only).
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}

_SERVER_LIVE = Call("GET", "/v2/health/live")
_SERVER_READY = Call("GET", "/v2/health/ready")
_SERVER_METADATA = Call("GET", "/v2")
_INDEX = Call("POST", "/v2/repository/index")


# -- tensors -------------------------------------------------------------------------------------
def decode_inputs(request: Any) -> dict[str, np.ndarray]:
    """A ModelInferRequest's input tensors: raw contents for all of them, or typed contents."""
    tensors, raw = request.inputs, request.raw_input_contents
    if not tensors:
        raise BadRequest("'inputs' must be a non-empty list of tensors")
    if raw and len(raw) != len(tensors):
        raise BadRequest(
            f"raw_input_contents holds {len(raw)} buffers for {len(tensors)} inputs: send one "
            "per input, or none and each input's contents"
        )
    inputs: dict[str, np.ndarray] = {}
    for i, tensor in enumerate(tensors):
        name, shape, datatype = tensor.name, list(tensor.shape), tensor.datatype
        if raw:
            if tensor.HasField("contents"):
                raise BadRequest(f"input {name!r}: both contents and raw_input_contents")
            array = oip.tensor_from_bytes(name, shape, datatype, raw[i])
        else:
            oip.check_tensor(name, shape, datatype)
            array = oip.tensor_from_values(name, shape, datatype, _contents(tensor))
        if name in inputs:
            raise BadRequest(f"input {name!r} appears twice")
        inputs[name] = array
    return inputs


def _contents(tensor: Any) -> Any:
    """The typed contents of an input tensor, from its datatype's own field only."""
    name, datatype = tensor.name, tensor.datatype
    field = _CONTENTS.get(datatype)
    if field is None:
        raise BadRequest(f"input {name!r}: {datatype} has no typed contents: send it raw")
    given = [f.name for f, _ in tensor.contents.ListFields()]
    other = [f for f in given if f != field]
    if other:
        raise BadRequest(f"input {name!r}: datatype {datatype} takes {field}, got {other[0]}")
    return getattr(tensor.contents, field)


def encode_outputs(result: Prediction, request_id: str, raw: bool) -> Any:
    """The ModelInferResponse: the outputs asked for, raw (as the request came, or where a
    datatype has no typed contents) or typed, and the version that answered."""
    mv = result.version
    response = messages.ModelInferResponse(
        model_name=mv.name, model_version=mv.version, id=request_id
    )
    arrays = [(name, side_by_side(value)) for name, value in result.outputs.items()]
    typed = [(name, array, oip.datatype_of(array)) for name, array in arrays]
    raw = raw or any(datatype not in _CONTENTS for _, _, datatype in typed)
    for name, array, datatype in typed:
        tensor = response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        if result.explained is not None and name == CONTRIBUTIONS:
            # As over HTTP, but each a JSON list in a string parameter (gRPC has no lists).
            for key, value in oip.contribution_parameters(result.explained).items():
                tensor.parameters[key].string_param = codecs.encode_json(value).decode()
        if raw:
            response.raw_output_contents.append(oip.raw_bytes(array, datatype))
        elif datatype == "BYTES":
            tensor.contents.bytes_contents.extend(
                v if isinstance(v, bytes) else str(v).encode() for v in array.ravel().tolist()
            )
        else:
            getattr(tensor.contents, _CONTENTS[datatype]).extend(array.ravel().tolist())
    if result.ignored:
        header = codecs.ignored_columns_header(result.ignored)
        response.parameters[IGNORED_COLUMNS].string_param = header
    return response


def _parameters(request: Any) -> dict[str, Any]:
    return {
        k: getattr(p, p.WhichOneof("parameter_choice") or "string_param")
        for k, p in request.parameters.items()
    }


def _deadline(timeout_us: Any, remaining_s: float | None) -> float | None:
    """The earlier of ``parameters.timeout`` and the call's own gRPC deadline."""
    deadlines = [oip.deadline_after(timeout_us)]
    if remaining_s is not None:
        deadlines.append(time.monotonic() + remaining_s)
    return min((d for d in deadlines if d is not None), default=None)


# -- the service ---------------------------------------------------------------------------------
class InferenceServicer:
    """``inference.GRPCInferenceService``'s RPCs, each a thin shell around :mod:`service.oip`."""

    def __init__(
        self,
        manager: ModelManager,
        settings: Settings,
        admission: Admission,
        is_ready: Callable[[], bool],
        version: str,
    ) -> None:
        self.manager = manager
        self.settings = settings
        self.calls = Calls(admission)
        self.is_ready = is_ready
        self.version = version

    async def ServerLive(self, request: Any, context: Any) -> Any:
        async def live() -> Any:
            return messages.ServerLiveResponse(live=True)

        return await self.calls.run(_SERVER_LIVE, context, live)

    async def ServerReady(self, request: Any, context: Any) -> Any:
        async def ready() -> Any:
            return messages.ServerReadyResponse(ready=self.is_ready())

        return await self.calls.run(_SERVER_READY, context, ready)

    async def ServerMetadata(self, request: Any, context: Any) -> Any:
        async def metadata() -> Any:
            return messages.ServerMetadataResponse(**oip.server_metadata(self.version))

        return await self.calls.run(_SERVER_METADATA, context, metadata)

    async def ModelMetadata(self, request: Any, context: Any) -> Any:
        name, version = request.name, request.version or None
        call = model_call("GET", "/v2/models/{name}", request.name, request.version)

        async def metadata() -> Any:
            doc = await oip.model_metadata(self.manager, name, version)
            return messages.ModelMetadataResponse(**doc)

        return await self.calls.run(call, context, metadata)

    async def ModelReady(self, request: Any, context: Any) -> Any:
        name, version = request.name, request.version or None
        call = model_call("GET", "/v2/models/{name}/ready", name, request.version)

        async def ready() -> Any:
            status = oip.readiness(self.manager, name, version)
            return messages.ModelReadyResponse(ready=status == 200)

        return await self.calls.run(call, context, ready)

    async def ModelInfer(self, request: Any, context: Any) -> Any:
        name = request.model_name
        call = model_call("POST", "/v2/models/{name}/infer", name, request.model_version)

        async def infer() -> Any:
            params = _parameters(request)
            strict = params.get("strict_columns", self.settings.strict_columns)
            if not isinstance(strict, bool):
                raise BadRequest("parameter 'strict_columns' must be a bool_param")
            result = await oip.infer(
                self.manager,
                name,
                request.model_version or None,
                lambda: decode_inputs(request),
                outputs=tuple(o.name for o in request.outputs) or None,
                deadline=_deadline(params.get("timeout"), context.time_remaining()),
                strict_columns=strict,
                route_key=metadata_value(context, ROUTE_KEY_HEADER),
            )
            t0 = time.perf_counter()
            response = encode_outputs(result, request.id, bool(request.raw_input_contents))
            oip.record_encode(self.manager, result, t0)
            return response

        return await self.calls.run(call, context, infer)

    async def RepositoryIndex(self, request: Any, context: Any) -> Any:
        async def index() -> Any:
            entries = oip.repository_index(self.manager)
            if request.ready:  # only the versions that serve
                entries = [e for e in entries if e["state"] in SERVABLE]
            return messages.RepositoryIndexResponse(models=entries)

        return await self.calls.run(_INDEX, context, index)

    async def RepositoryModelLoad(self, request: Any, context: Any) -> Any:
        name = request.model_name
        call = Call("POST", "/v2/repository/models/{name}/load", name)

        async def load() -> Any:
            await oip.load(self.manager, self.settings, name)
            return messages.RepositoryModelLoadResponse()

        return await self.calls.run(call, context, load)

    async def RepositoryModelUnload(self, request: Any, context: Any) -> Any:
        name = request.model_name
        call = Call("POST", "/v2/repository/models/{name}/unload", name)

        async def unload() -> Any:
            await self.manager.unload(name)
            return messages.RepositoryModelUnloadResponse()

        return await self.calls.run(call, context, unload)


class GrpcServer:
    """The gRPC server of one application: :meth:`start` in its lifespan, :meth:`stop` after."""

    def __init__(
        self, servicer: InferenceServicer, settings: Settings, *, share_port: bool = False
    ) -> None:
        """``share_port``: the workers of one pod (service/pod.py) bind the same port, and
        the kernel spreads the connections over them."""
        assert settings.grpc_port is not None
        self.settings = settings
        self.server = grpc.aio.server(
            options=[
                # One limit for a request, whichever protocol it comes by.
                ("grpc.max_receive_message_length", settings.max_body_bytes),
                # An answer is as large as the rows asked for make it (as over HTTP).
                ("grpc.max_send_message_length", -1),
                # Else a second process on the same port would share its calls instead of failing.
                ("grpc.so_reuseport", int(share_port)),
            ]
        )
        add_servicer(servicer, self.server)
        self.port: int | None = None

    async def start(self) -> int:
        """Bind and serve; the port bound. A port that cannot be bound stops the start."""
        host, port = self.settings.host, self.settings.grpc_port
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            bound = self.server.add_insecure_port(address)
        except RuntimeError as exc:  # grpcio raises where older releases returned 0
            raise OSError(f"cannot serve gRPC on {address}: {exc}") from None
        if not bound:
            raise OSError(f"cannot serve gRPC on {address}: the port is taken or not valid")
        await self.server.start()
        self.port = bound
        log.info("gRPC (Open Inference Protocol v2) on %s", address)
        return bound

    async def stop(self) -> None:
        await self.server.stop(STOP_GRACE_S)
