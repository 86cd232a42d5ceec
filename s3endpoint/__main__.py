"""``python -m s3endpoint``: the S3 endpoint on SWITCHYARD_S3_ENDPOINT_HOST:PORT."""

from __future__ import annotations

import os
import sys

from config.processes import s3_endpoint_command


def main() -> None:
    host = os.environ.get("SWITCHYARD_S3_ENDPOINT_HOST", "127.0.0.1")
    port = int(os.environ.get("SWITCHYARD_S3_ENDPOINT_PORT", "9000"))
    argv = s3_endpoint_command(host, port)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
    sys.exit(1)
