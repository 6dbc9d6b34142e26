"""Serving a trained model over HTTP with continuous batching: a pool of KV-cache slots
(:mod:`aiayn.serve.slots`), one engine loop that owns the model (:mod:`aiayn.serve.engine`),
the FastAPI application (:mod:`aiayn.serve.app`) with its routers
(:mod:`aiayn.serve.routes`) over one :class:`~aiayn.serve.served.ServedModel`, and the
process's start and stop (:mod:`aiayn.serve.server`)."""
