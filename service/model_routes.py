"""The model-management routes: register (multipart upload), list, describe, delete."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import FastAPI, File, Form, Query, Request, UploadFile
from fastapi.responses import Response
from pydantic import ValidationError

from service import artifacts, codecs, openapi, store
from service.access import Auth
from service.components import Components
from service.errors import BadRequest, Forbidden, InvalidInput, ModelRejected, PayloadTooLarge
from service.models import ModelManager
from service.pod_sync import describe, reported_state
from service.settings import Settings
from service.shadow_rule import InvalidRule, ShadowRule
from service.versions import ModelOptions, ModelVersion, State, Upload, failure_error
from service.web import json_response


def add_model_routes(app: FastAPI, parts: Components) -> None:
    settings, manager = parts.settings, parts.manager
    # In a worker of a pod, READY is reported once every worker serves the version.
    pod = parts.pod.sync if parts.pod is not None else None

    @app.post(
        "/models",
        tags=["models"],
        status_code=202,
        summary="Register a model version",
        responses={
            201: {"model": openapi.VersionDescription, "description": "READY (with ?wait=true)"},
            202: {"model": openapi.VersionDescription, "description": "Accepted: poll Location"},
            **openapi.errors(400, *openapi.AUTH, 409, 413, 422),
        },
    )
    async def register_model(
        request: Request,
        file: Annotated[UploadFile, File(description="the model artifact")],
        name: Annotated[str, Form(description="model name")],
        version: Annotated[str | None, Form()] = None,
        format: Annotated[
            str | None, Form(description="skops, lightgbm, xgboost-json, ...")
        ] = None,
        sample: Annotated[str | None, Form(description="JSON rows for schema and parity")] = None,
        options: Annotated[str | None, Form(description="JSON object of ModelOptions")] = None,
        wait: Annotated[
            bool,
            Query(
                description="answer when the load ends: 201 (READY, or RETIRED since), or its error"
            ),
        ] = False,
        promote: Annotated[
            bool,
            Query(
                description="make it current once READY (false: stored only, for an alias, a "
                "traffic split or a later promotion; a model's first version serves anyway)"
            ),
        ] = True,
    ) -> Response:
        data = await file.read()
        if not data:
            raise BadRequest("field 'file': the uploaded file is empty")
        if len(data) > settings.max_upload_bytes:  # the middleware refuses most before this
            raise PayloadTooLarge(f"the upload exceeds {settings.max_upload_bytes} bytes")
        upload = Upload(
            name=_form_name("name", name, "model name"),
            data=data,
            filename=file.filename or "",
            version=_form_name("version", version or None, "version"),
            format=_parse_format(format or None),
            sample=_parse_sample(sample),
            options=_parse_options(options),
            actor=actor(request),
            promote=promote,
        )
        fmt = upload.format
        if fmt == "pickle" or (fmt is None and data[:1] == b"\x80"):
            upload.pickle_allowed = _pickle_allowed(settings, parts.auth, request)
        mv = await manager.register(upload)
        location = f"/models/{mv.name}/versions/{mv.version}"
        if wait:
            await manager.wait(mv, settings.register_wait_s)
            if mv.state is State.FAILED:
                raise failure_error(mv)
            # Created, whether still READY or already RETIRED (deleted or overtaken by a newer
            # version before this coroutine ran again): 202 would send the client to poll a
            # version that has finished loading.
            if mv.state is not State.LOADING:
                return json_response(mv.describe(), 201, {"Location": location})
        return json_response(mv.describe(), 202, {"Location": location})

    @app.get(
        "/models",
        tags=["models"],
        summary="List models",
        responses={**openapi.ok(openapi.ModelList), **openapi.errors(*openapi.AUTH)},
    )
    async def list_models(request: Request) -> Response:
        out = []
        for name in manager.names():
            current = manager.current(name)
            out.append(
                {
                    "name": name,
                    "current": current.version if current else None,
                    "versions": [
                        {"version": v.version, "state": reported_state(pod, v).value}
                        for v in manager.versions(name)
                    ],
                }
            )
        return json_response({"models": out})

    @app.get(
        "/models/{name}",
        tags=["models"],
        summary="Describe a model",
        responses={**openapi.ok(openapi.ModelDescription), **openapi.errors(*openapi.AUTH, 404)},
    )
    async def describe_model(request: Request, name: str) -> Response:
        current = manager.current(name)
        return json_response(
            {
                "name": name,
                "current": current.version if current else None,
                "versions": [describe(pod, v) for v in manager.versions(name)],
                "history": [c.to_json() for c in manager.histories.get(name, [])],
                "aliases": manager.aliases.get(name, {}),
                "traffic": manager.traffic.get(name, {}),
                "shadow": _shadow(manager, name),
            }
        )

    @app.put(
        "/models/{name}/aliases/{alias}",
        tags=["models"],
        summary="Name a stored version by an alias (it serves beside the current one)",
        responses={
            **openapi.ok(openapi.AliasAnswer),
            **openapi.errors(400, *openapi.AUTH, 404, 409, 503),
        },
    )
    async def set_alias(request: Request, name: str, alias: str) -> Response:
        version = await _version_field(request)
        try:
            store.validate_alias(alias)
        except store.InvalidName as exc:
            raise BadRequest(f"path 'alias': {exc}") from None
        mv = await manager.set_alias(name, alias, version)
        return json_response({"name": name, "alias": alias, "version": mv.version})

    @app.put(
        "/models/{name}/traffic",
        tags=["models"],
        summary="Split unversioned requests between versions by weight (a canary)",
        responses={
            **openapi.ok(openapi.TrafficAnswer),
            **openapi.errors(400, *openapi.AUTH, 404, 409, 503),
        },
    )
    async def set_traffic(request: Request, name: str) -> Response:
        weights = (await _json_body(request)).get("weights")
        if not isinstance(weights, dict):
            raise BadRequest(
                'the body must be a JSON object of weights by version: {"weights": {"2": 95, '
                '"3": 5}} ({"weights": {}}: all to the current version)'
            )
        try:
            split = await manager.set_traffic(name, weights)
        except store.InvalidRecord as exc:
            raise BadRequest(f"field 'weights': {exc}") from None
        return json_response({"name": name, "weights": split})

    @app.put(
        "/models/{name}/shadow",
        tags=["models"],
        summary="Mirror a share of live requests to another version and compare the answers",
        responses={
            **openapi.ok(openapi.ShadowAnswer),
            **openapi.errors(400, *openapi.AUTH, 404, 409, 503),
        },
    )
    async def set_shadow(request: Request, name: str) -> Response:
        version = await _version_field(request)
        doc = await _json_body(request)
        share = doc.get("share", 0.1)
        try:
            store.check_share(share)
        except store.InvalidRecord as exc:
            raise BadRequest(f"field 'share': {exc}") from None
        try:
            rule = None if doc.get("rule") is None else ShadowRule.from_json(doc["rule"])
        except InvalidRule as exc:
            raise BadRequest(str(exc)) from None
        await manager.set_shadow(name, version, share, rule)
        return json_response({"name": name, "shadow": _shadow(manager, name)})

    @app.delete(
        "/models/{name}/shadow",
        tags=["models"],
        status_code=204,
        summary="Stop mirroring requests",
        responses=openapi.errors(*openapi.AUTH, 404),
    )
    async def delete_shadow(request: Request, name: str) -> Response:
        await manager.set_shadow(name, None)
        return Response(status_code=204)

    @app.delete(
        "/models/{name}/aliases/{alias}",
        tags=["models"],
        status_code=204,
        summary="Remove an alias",
        responses=openapi.errors(*openapi.AUTH, 404),
    )
    async def delete_alias(request: Request, name: str, alias: str) -> Response:
        await manager.delete_alias(name, alias)
        return Response(status_code=204)

    @app.post(
        "/models/{name}/promote",
        tags=["models"],
        summary="Make a stored version current",
        responses={
            **openapi.ok(openapi.CurrentChangeAnswer),
            **openapi.errors(400, *openapi.AUTH, 404, 409, 503),
        },
    )
    async def promote(request: Request, name: str) -> Response:
        version = await _version_field(request)
        before = manager.current(name)
        mv = await manager.promote(name, version, actor(request))
        return json_response(_changed(name, before, mv.version, manager.histories.get(name, [])))

    @app.post(
        "/models/{name}/rollback",
        tags=["models"],
        summary="Make the previous current version current again",
        responses={
            **openapi.ok(openapi.CurrentChangeAnswer),
            **openapi.errors(*openapi.AUTH, 404, 409, 503),
        },
    )
    async def rollback(request: Request, name: str) -> Response:
        before = manager.current(name)
        mv = await manager.rollback(name, actor(request))
        return json_response(_changed(name, before, mv.version, manager.histories.get(name, [])))

    @app.get(
        "/models/{name}/versions/{version}",
        tags=["models"],
        summary="Describe a version",
        responses={**openapi.ok(openapi.VersionDescription), **openapi.errors(*openapi.AUTH, 404)},
    )
    async def describe_version(request: Request, name: str, version: str) -> Response:
        return json_response(describe(pod, manager.lookup(name, version)))

    @app.delete(
        "/models/{name}",
        tags=["models"],
        status_code=204,
        summary="Delete a model and all its versions",
        responses=openapi.errors(*openapi.AUTH, 404),
    )
    async def delete_model(request: Request, name: str) -> Response:
        await manager.delete(name, actor=actor(request))
        return Response(status_code=204)

    @app.delete(
        "/models/{name}/versions/{version}",
        tags=["models"],
        status_code=204,
        summary="Delete one version",
        responses=openapi.errors(*openapi.AUTH, 404),
    )
    async def delete_version(request: Request, name: str, version: str) -> Response:
        await manager.delete(name, version, actor(request))
        return Response(status_code=204)


#: The header naming who changes a model (recorded in its version history), else the client.
ACTOR_HEADER = "x-kestrel-actor"
_ACTOR_LIMIT = 128


def actor(request: Request) -> str:
    """Who asks: the :data:`ACTOR_HEADER` (printable, at most 128 characters), else the
    client's address."""
    given = request.headers.get(ACTOR_HEADER)
    if given is not None:
        if len(given) > _ACTOR_LIMIT or not given.isprintable():
            raise BadRequest(
                f"header {ACTOR_HEADER!r}: at most {_ACTOR_LIMIT} printable characters"
            )
        return given
    client = request.client
    return f"client {client.host}" if client is not None else ""


async def _json_body(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object ({} when empty)."""
    body = await request.body()
    doc = codecs.parse_json_field(body.decode("utf-8", "replace") or "{}", "body")
    if not isinstance(doc, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(doc).__name__}")
    return doc


def _shadow(manager: ModelManager, name: str) -> dict[str, Any] | None:
    shadow = manager.shadows.get(name)
    return None if shadow is None else shadow.to_json()


async def _version_field(request: Request) -> str:
    """The ``version`` of a JSON body ``{"version": "2"}``, checked."""
    doc = await _json_body(request)
    if "version" not in doc:
        raise BadRequest('the body must be a JSON object naming the version: {"version": "2"}')
    value = doc["version"]
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    name = _form_name("version", value if isinstance(value, str) else None, "version")
    if name is None:
        raise BadRequest(f"field 'version' must be a version name, got {value!r}")
    return name


def _changed(
    name: str, before: ModelVersion | None, current: str, history: list[store.CurrentChange]
) -> dict[str, Any]:
    previous = before.version if before is not None else None
    changed = previous != current and history and history[-1].current == current
    return {
        "name": name,
        "previous": previous,
        "current": current,
        "change": history[-1].to_json() if changed else None,
    }


def _form_name(field: str, value: str | None, what: str) -> str | None:
    """A model name or version from the form, checked here to name the field it came in."""
    if value is None:
        return None
    try:
        return store.validate_name(value, what)
    except store.InvalidName as exc:
        raise BadRequest(f"field {field!r}: {exc}") from None


def _parse_format(value: str | None) -> str | None:
    if value is not None and value not in artifacts.FORMATS:
        raise ModelRejected(
            f"field 'format': unknown model format {value!r}; accepted: "
            f"{', '.join(artifacts.FORMATS)} (or leave it out: the file's content tells)"
        )
    return value


def _parse_sample(text: str | None) -> Any:
    if text is None or not text.strip():
        return None
    # NaN and Infinity too: a sample of real rows has missing values, and the parity check
    # compares the source and the compiled model on them as they are.
    doc = codecs.parse_json_field(text, "sample", allow_nan=True)
    if isinstance(doc, dict) and "rows" in doc:
        doc = doc["rows"]
    if isinstance(doc, dict) and "columns" in doc:
        doc = doc["columns"]
    if not isinstance(doc, (list, dict)) or not doc:
        raise BadRequest(
            "field 'sample' must be JSON rows (a non-empty list) or {column: [values]}"
        )
    return doc


def _parse_options(text: str | None) -> ModelOptions:
    if text is None or not text.strip():
        return ModelOptions()
    doc = codecs.parse_json_field(text, "options")
    if not isinstance(doc, dict):
        raise BadRequest(f"field 'options' must be a JSON object, got {type(doc).__name__}")
    try:
        return ModelOptions.model_validate(doc)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(options)'}: {e['msg']}" for e in exc.errors()
        )
        raise InvalidInput(f"field 'options': {problems}") from None


def _pickle_allowed(settings: Settings, auth: Auth, request: Request) -> bool:
    if not settings.allow_pickle:
        raise Forbidden(
            "pickle/joblib uploads are disabled (they can run code); upload .skops, LightGBM "
            "text or XGBoost JSON, or ask the operator to set KESTREL_ALLOW_PICKLE=true"
        )
    if not auth.is_admin(request.scope["headers"]):
        raise Forbidden("pickle/joblib uploads need the admin token (KESTREL_ADMIN_TOKEN)")
    return True
