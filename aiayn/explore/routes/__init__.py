"""The explorer's routes, one router per concern: the page and its scripts
(``page``), the views of a model (``views``)
and the teaching views (``lessons``).  Each handler is a few lines
calling the library."""
