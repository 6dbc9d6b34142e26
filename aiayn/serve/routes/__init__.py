"""The HTTP routes of ``aiayn serve``, one router per concern, each built over the
:class:`~aiayn.serve.served.ServedModel` it answers with: the OpenAI-compatible API
(:mod:`~aiayn.serve.routes.openai_api`), translation (:mod:`~aiayn.serve.routes.translation`)
and the probes (:mod:`~aiayn.serve.routes.monitoring`).  A handler is a few lines handing the
request to the module that does the work."""
