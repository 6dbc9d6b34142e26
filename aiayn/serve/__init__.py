"""Serving a trained model over HTTP with continuous batching: a pool of KV-cache slots
(``aiayn.serve.slots``), one engine loop that owns the model (``aiayn.serve.engine``),
the FastAPI application (``aiayn.serve.app``) with its routers
(``aiayn.serve.routes``) over one ``ServedModel``, and the
process's start and stop (``aiayn.serve.server``)."""
