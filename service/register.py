"""``kestrel register FILE``: upload a model to a running server and follow it until READY.

``POST /models`` answers ``202`` with the new version's ``Location`` as soon as the upload is
checked; the version then compiles and warms up every bucket and is checked against the source
model. This polls the version, showing the progress it reports, and ends with what the user needs
next: the state, the buckets, the parity result and a ``curl`` command that scores the model.
"""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import orjson
from rich.console import Console

from service.terminal import CommandError, LoadDisplay, joined, parse_json, read_file

POLL_S = 0.25  # between GETs of a LOADING version: fine-grained enough to watch each bucket
CONNECT_TIMEOUT_S = 10.0


def register_file(
    path: Path,
    *,
    name: str,
    url: str,
    version: str | None = None,
    format: str | None = None,
    sample: Path | None = None,
    options: str | None = None,
    token: str | None = None,
    wait: bool = True,
    timeout: float = 900.0,
    as_json: bool = False,
    progress: Console | None = None,
) -> int:
    """Register ``path`` as model ``name`` with the server at ``url``; print the outcome.

    ``timeout``: seconds for the whole command (upload and load). ``as_json``: print the
    version's description instead of the summary. ``progress``: where the live progress goes
    (default stderr). Raises :class:`CommandError` for anything the user can fix.
    """
    url = url.rstrip("/")
    form = {"name": name}
    if version:
        form["version"] = version
    if format:
        form["format"] = format
    sample_rows = None
    if sample is not None:
        data = read_file(sample, "--sample")
        sample_rows = parse_json(data, f"--sample {sample}", allow_nan=True)
        form["sample"] = data.decode()
    if options is not None:
        parse_json(options, "--options")  # the server validates the fields; this, the syntax
        form["options"] = options
    deadline = time.monotonic() + timeout
    display = LoadDisplay(progress or Console(stderr=True))
    client = service_client(url, token, timeout)
    location = None
    try:
        with client, display:
            doc, location = _upload(client, path, form, display)
            if wait:
                doc = _follow(client, location, doc, display, deadline, timeout)
    except KeyboardInterrupt:
        if location is None:
            raise
        raise CommandError(
            f"interrupted; the server goes on loading it: GET {url}{location}", 130
        ) from None
    if as_json:
        print(orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode())
    if doc["state"] == "FAILED":
        raise CommandError(f"model {name!r} version {doc['version']} FAILED: {doc.get('error')}")
    if not as_json:
        print(summary(doc, url, sample_rows))
    return 0


def _upload(
    client: httpx.Client, path: Path, form: dict[str, str], display: LoadDisplay
) -> tuple[dict[str, Any], str]:
    """POST the file without waiting; the 202's description and the version's Location."""
    try:
        file = path.open("rb")
    except OSError as exc:
        raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None
    with file:
        size = os.fstat(file.fileno()).st_size
        response = http_request(
            client,
            "POST",
            "/models",
            params={"wait": "false"},
            data=form,
            files={"file": (path.name, display.upload(file, size))},
        )
    return response.json(), response.headers["Location"]


def _follow(
    client: httpx.Client,
    location: str,
    doc: dict[str, Any],
    display: LoadDisplay,
    deadline: float,
    timeout: float,
) -> dict[str, Any]:
    """Poll the version until it is no longer LOADING; its last description."""
    while doc["state"] == "LOADING":
        progress = doc.get("progress") or {}
        display.show(
            progress.get("phase", "compiling"),
            progress.get("buckets_done", 0),
            progress.get("buckets_total"),
        )
        if time.monotonic() > deadline:
            raise CommandError(
                f"model {doc['name']!r} version {doc['version']} is still LOADING after "
                f"{timeout:g} s (--timeout); the server goes on loading it: "
                f"GET {client.base_url.join(location)}"
            )
        time.sleep(POLL_S)
        doc = http_request(client, "GET", location).json()
    buckets = doc.get("buckets") or []
    if doc["state"] == "READY" and buckets and not display.shown("compiling"):
        # A load faster than a poll still reports what it compiled.
        display.show("compiling", len(buckets), len(buckets))
    return doc


def service_client(
    url: str, token: str | None, timeout: float, headers: dict[str, str] | None = None
) -> httpx.Client:
    """A client of the service at ``url`` (the admin ``token``, ``timeout`` seconds per request,
    connecting within :data:`CONNECT_TIMEOUT_S`); a bad URL is a :class:`CommandError`."""
    auth = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        return httpx.Client(
            base_url=url,
            headers={**auth, **(headers or {})},
            timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT_S)),
        )
    except httpx.InvalidURL as exc:
        raise CommandError(f"--url {url!r} is not a valid URL: {exc}") from None


def http_request(client: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """``client.request``, with every failure a :class:`CommandError` that says what to do."""
    base = str(client.base_url).rstrip("/")
    try:
        response = client.request(method, path, **kwargs)
    except httpx.UnsupportedProtocol:
        raise CommandError(f"--url {base!r} must start with http:// or https://") from None
    except httpx.ConnectError as exc:
        raise CommandError(
            f"cannot reach a Kestrel server at {base} ({exc}); start one with `kestrel serve`, "
            "or point --url at it"
        ) from None
    except httpx.TimeoutException:
        timeout = client.timeout.read
        raise CommandError(f"{base} did not answer within {timeout:g} s (--timeout)") from None
    except httpx.TransportError as exc:
        raise CommandError(f"lost the connection to {base}: {exc}") from None
    if response.is_error:
        raise CommandError(
            f"{method} {base}{path} answered {response.status_code} {response.reason_phrase}: "
            f"{_server_message(response)}"
        )
    return response


def _server_message(response: httpx.Response) -> str:
    """The message of the service's error body, ``{"error": {"message"}}``; else the text."""
    try:
        error = response.json().get("error")
    except (ValueError, AttributeError):
        error = None
    if isinstance(error, dict) and error.get("message"):
        return joined(str(error["message"]))
    return joined(response.text[:300]) or "(no body)"


# -- the summary ---------------------------------------------------------------------------------
def summary(doc: dict[str, Any], url: str, sample: Any = None) -> str:
    """What a person reads after the registration: state, buckets, parity, and how to score."""
    head = f"model {doc['name']!r} version {doc['version']} is {doc['state']}"
    if doc.get("load_seconds") is not None:
        head += f" (loaded in {doc['load_seconds']:.1f} s)"
    lines = [head]
    if doc["state"] == "LOADING":
        lines.append(f"  follow it: GET {url}/models/{doc['name']}/versions/{doc['version']}")
    buckets = doc.get("buckets")
    if buckets:
        lines.append(f"  buckets: {len(buckets)} ({', '.join(map(str, buckets))} rows)")
    if doc.get("parity"):
        lines.append(f"  parity:  {_parity_line(doc['parity'])}")
    if doc.get("schema"):
        lines += ["score it:", f"  {curl_command(url, doc, sample)}"]
    return "\n".join(lines)


def _parity_line(parity: dict[str, Any]) -> str:
    rows, probes = parity["rows"], parity.get("probes", 0)
    where = f"{rows - probes} {parity['source']} rows and {probes} probe rows"
    if not parity["ok"]:
        return f"failed on {where}: {parity.get('problem')}"
    diffs = [m["max_abs_diff"] for m in parity.get("methods", []) if m["max_abs_diff"] is not None]
    largest = f" (largest difference {max(diffs):.1e})" if diffs else ""
    return f"ok on {where}{largest}"


def curl_command(url: str, doc: dict[str, Any], sample: Any = None) -> str:
    """A shell command scoring one row with the model: the sample's first row where one was
    uploaded, else a row made from the input schema (0 for numbers, a known category)."""
    columns = doc["schema"]["columns"]
    row = example_row(columns, _first_row(sample, [c["name"] for c in columns]))
    command = shlex.join(
        [
            "curl",
            "-sS",
            f"{url}/models/{quote(doc['name'], safe='')}/predict",
            "-H",
            "content-type: application/json",
            "-d",
            orjson.dumps([row]).decode(),
        ]
    )
    if os.environ.get("KESTREL_SCORING_TOKEN"):  # named, not printed: it is a secret
        command += ' -H "authorization: Bearer $KESTREL_SCORING_TOKEN"'
    return command


def example_row(columns: list[dict[str, Any]], given: dict[str, Any]) -> dict[str, Any]:
    """One row of the schema's ``columns``, taking the values ``given`` has."""
    row: dict[str, Any] = {}
    for column in columns:
        name = column["name"]
        known = [c for c in column.get("categories", []) if c is not None]
        if name in given:
            row[name] = given[name]
        elif known:
            row[name] = known[0]
        elif column["kind"] == "boolean":
            row[name] = False
        elif column["kind"] == "categorical":
            row[name] = ""
        else:
            row[name] = 0.0
    return row


def _first_row(sample: Any, names: list[str]) -> dict[str, Any]:
    """The first row of an uploaded sample (rows as objects or arrays, ``{"rows": ...}`` or
    ``{"columns": {name: values}}``) as {column: value}; {} when it has none."""
    if isinstance(sample, dict):
        if "rows" in sample:
            sample = sample["rows"]
        else:
            columns = sample.get("columns", sample)
            if not isinstance(columns, dict):
                return {}
            return {k: v[0] for k, v in columns.items() if isinstance(v, list) and v}
    if not isinstance(sample, list) or not sample:
        return {}
    first = sample[0]
    if isinstance(first, dict):
        return first
    if isinstance(first, list) and len(first) == len(names):
        return dict(zip(names, first, strict=True))
    return {}
