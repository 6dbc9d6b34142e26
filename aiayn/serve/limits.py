"""The defaults of the per-request limits that are settings of ``aiayn serve`` (imports
nothing, so the command line reads them without loading the server).

Every request's work is bounded: its body by ``max_body`` (413 above, refused before it is
read), its prompt by ``max_prompt_tokens`` and the context, its completion by
``max_new_tokens``, its stop strings by ``MAX_STOPS`` and ``max_stop_chars``, its
choices (``n`` and ``best_of`` over every prompt of a batch) by ``max_n``.
"""

DEFAULT_MAX_BODY = 4 * 2**20  # bytes: a 4,096-token prompt is about 20 KB of text
MAX_STOPS = 4  # stop strings per request, as OpenAI allows
MAX_STOP_CHARS = 1024  # the longest stop string: matching it costs O(its length) a token
MAX_N = 16  # choices a request may ask for (n, best_of), each an engine request
MAX_LOGPROBS = 20  # top log-probabilities per token, as OpenAI allows
