"""The HTTP routes of ``aiayn serve``, one router per concern, each built over the
``ServedModel`` it answers with: the OpenAI-compatible API
(``openai_api``), translation (``translation``)
and the probes (``monitoring``).  A handler is a few lines handing the
request to the module that does the work."""
