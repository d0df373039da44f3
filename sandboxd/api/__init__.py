"""
What the API looks like, read only by ``/openapi.json`` and the docs: the
request and response schema of every endpoint, the OpenAPI document built
from it, and the generated ``docs/api.md``.
"""
