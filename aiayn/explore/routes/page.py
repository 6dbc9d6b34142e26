"""The explorer's page (``static/``) and Plotly.js, served from the ``plotly`` Python
package's own copy, so the explorer works offline."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

STATIC = Path(__file__).resolve().parent.parent / "static"


def router() -> APIRouter:
    """``GET /`` (the page) and ``GET /vendor/plotly.min.js``; ``static/`` itself is mounted
    by the app."""
    import plotly

    routes = APIRouter()
    plotly_js = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"

    @routes.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html")

    @routes.get("/vendor/plotly.min.js", include_in_schema=False)
    def plotly_bundle() -> FileResponse:
        return FileResponse(plotly_js, media_type="text/javascript")

    return routes
