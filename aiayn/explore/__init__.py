"""``aiayn explore``: a local web app over real models and the library's teaching views.

* :mod:`aiayn.explore.registry` -- the models a server offers, by name;
* :mod:`aiayn.explore.analysis` -- attention, next-token and translation views of a model;
* :mod:`aiayn.explore.server` -- the FastAPI app and its page (``static/``, drawn with Plotly).
* :mod:`aiayn.explore.routes` -- its routers: the page, the views of a model, the lessons;
* :mod:`aiayn.explore.requests`, :mod:`aiayn.explore.errors` -- the bodies the endpoints
  take and the errors they give (a body too large is refused by aiayn/serve/body_limit.py).
"""
