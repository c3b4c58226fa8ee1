"""The /docs (Swagger UI) and /redoc pages with their JS and CSS served by the ingress itself.

FastAPI's own pages load their assets from a CDN, so they are blank on a cluster without
internet access; the `fastapi-offline` package ships the same Swagger UI 5 and ReDoc 2 files.
The handlers are module functions that read the app from the request, so the copy of the app
that serve.ingress pickles needs nothing from this module but its name.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/docs-assets"
# The package's data folder: swagger-ui-bundle.js, swagger-ui.css, redoc.standalone.js,
# favicon.png.
ASSETS_PACKAGE = ("fastapi_offline", "static")


def add_offline_docs(app: FastAPI) -> None:
    """Serve /docs, its OAuth2 redirect page and /redoc as FastAPI would, from local assets.
    The app must be made with `docs_url=None, redoc_url=None`."""
    app.mount(ASSETS_URL, StaticFiles(packages=[ASSETS_PACKAGE]), name="docs-assets")
    app.add_route("/docs", swagger_ui, include_in_schema=False)
    app.add_route(app.swagger_ui_oauth2_redirect_url, oauth2_redirect, include_in_schema=False)
    app.add_route("/redoc", redoc, include_in_schema=False)


def _root(request: Request) -> str:
    # Behind a route prefix every URL of the page starts with it, as in FastAPI's own pages.
    return request.scope.get("root_path", "").rstrip("/")


async def swagger_ui(request: Request) -> HTMLResponse:
    app, root = request.app, _root(request)
    return get_swagger_ui_html(
        openapi_url=root + app.openapi_url,
        title=f"{app.title} - Swagger UI",
        oauth2_redirect_url=root + app.swagger_ui_oauth2_redirect_url,
        swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
        swagger_ui_parameters=app.swagger_ui_parameters,
    )


async def oauth2_redirect(request: Request) -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


async def redoc(request: Request) -> HTMLResponse:
    app, root = request.app, _root(request)
    return get_redoc_html(
        openapi_url=root + app.openapi_url,
        title=f"{app.title} - ReDoc",
        redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
        redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
        with_google_fonts=False,  # fonts.googleapis.com is not reachable offline either
    )
