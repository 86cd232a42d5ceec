"""Switchyard's own S3-protocol endpoint: uploads of registered files (docs/files.md).

A plain ASGI process (``uvicorn s3endpoint.asgi:app``) beside the gateway. Clients upload with
``aws s3 cp``, boto3 or rclone unchanged; the endpoint checks AWS Signature V4 with botocore's
signer, maps the use case's virtual bucket onto the real files bucket and announces each
finished upload on ``sy:uploads``.
"""
