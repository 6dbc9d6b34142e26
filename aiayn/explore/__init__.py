"""``aiayn explore``: a local web app over real models and the library's teaching views.

* ``aiayn.explore.registry`` -- the models a server offers, by name;
* ``aiayn.explore.analysis`` -- attention, next-token and translation views of a model;
* ``aiayn.explore.server`` -- the FastAPI app and its page (``static/``, drawn with Plotly).
* ``aiayn.explore.routes`` -- its routers: the page, the views of a model, the lessons;
* ``aiayn.explore.requests``, ``aiayn.explore.errors`` -- the bodies the endpoints
  take and the errors they give (a body too large is refused by aiayn/serve/body_limit.py).
"""
