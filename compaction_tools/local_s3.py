"""A real S3 HTTP endpoint on 127.0.0.1 for the demo, the bench and the tests: moto's server mode.

Everything else talks to it exactly as to AWS S3, MinIO or R2: through the catalog properties
`s3.endpoint`, `s3.access-key-id`, `s3.secret-access-key` and `s3.region` (pyiceberg's own
names). Its objects live in this process's memory and are gone when it stops.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from compaction_assets.errors import CompactionError

# Fixed, made-up credentials: moto accepts any, and the tests plant these to prove they never leak.
ACCESS_KEY = "local-s3-access-key"
SECRET_KEY = "local-s3-secret-Vq7XbT2pLr9"
REGION = "us-east-1"


@dataclass(frozen=True)
class LocalS3:
    endpoint: str  # http://127.0.0.1:PORT
    bucket: str
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = REGION

    def warehouse(self, prefix: str = "warehouse") -> str:
        return f"s3://{self.bucket}/{prefix}"

    def catalog_properties(self, uri: str, prefix: str = "warehouse") -> dict[str, str]:
        """pyiceberg SQL catalog properties for a warehouse in this bucket."""
        return {
            "type": "sql",
            "uri": uri,
            "warehouse": self.warehouse(prefix),
            "s3.endpoint": self.endpoint,
            "s3.access-key-id": self.access_key,
            "s3.secret-access-key": self.secret_key,
            "s3.region": self.region,
        }

    def client(self):
        """A boto3 S3 client on this endpoint (for tests and set-up, not used by the product)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
        )


@contextmanager
def local_s3(bucket: str = "lake", port: int = 0) -> Iterator[LocalS3]:
    """Run moto's S3 server on 127.0.0.1 (`port` 0: a free one) with `bucket` created; stopped on exit."""
    try:
        from moto.server import ThreadedMotoServer
    except ImportError:
        raise CompactionError(
            "the local S3 server needs moto's server mode: pip install -e '.[s3]' (or 'moto[server]')"
        ) from None
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        host, bound = server.get_host_and_port()
        s3 = LocalS3(endpoint=f"http://{host}:{bound}", bucket=bucket)
        s3.client().create_bucket(Bucket=bucket)
        yield s3
    finally:
        server.stop()
