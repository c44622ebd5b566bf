"""Shared fixtures for service tests: a real S3 protocol endpoint served by moto."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

S3_REGION = "us-east-1"
S3_KEY = "testing"
S3_SECRET = "testing"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """URL of a moto S3 server (real HTTP, in a thread of this process) on a free port."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
def s3_storage_options(s3_endpoint: str) -> dict[str, object]:
    """fsspec/s3fs options for the moto endpoint.

    ``skip_instance_cache`` gives every store its own filesystem object (and listing cache), as a
    restarted server or a second replica would have: nothing is shared with an earlier writer.
    """
    return {
        "key": S3_KEY,
        "secret": S3_SECRET,
        "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": S3_REGION},
        "skip_instance_cache": True,
    }


@pytest.fixture
def s3_bucket(s3_endpoint: str) -> str:
    """A new, empty bucket on the moto endpoint (unique per test); returns its name."""
    import boto3

    name = f"kestrel-test-{uuid.uuid4().hex[:12]}"
    client = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name=S3_REGION,
        aws_access_key_id=S3_KEY,
        aws_secret_access_key=S3_SECRET,
    )
    client.create_bucket(Bucket=name)
    return name
