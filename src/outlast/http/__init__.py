"""The HTTP edge: a FastAPI app with the job routes, Server-Sent Events and a live dashboard.

``create_app(store, token=None)`` for mounting in your own ASGI app; ``serve(...)`` runs it
with uvicorn, as ``outlast serve`` does. Importing this package imports FastAPI.
"""

from __future__ import annotations

from outlast.http.app import create_app
from outlast.http.server import serve

__all__ = ["create_app", "serve"]
