"""Serving a trained model over HTTP with continuous batching: a pool of KV-cache slots
(:mod:`aiayn.serve.slots`), one engine loop that owns the model (:mod:`aiayn.serve.engine`),
and the FastAPI application (:mod:`aiayn.serve.app`)."""
