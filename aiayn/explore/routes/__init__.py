"""The explorer's routes, one router per concern: the page and its scripts
(:mod:`~aiayn.explore.routes.page`), the views of a model (:mod:`~aiayn.explore.routes.views`)
and the teaching views (:mod:`~aiayn.explore.routes.lessons`).  Each handler is a few lines
calling the library."""
