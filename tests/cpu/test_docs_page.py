"""/docs and /redoc work without internet access: their pages name only the ingress's own URLs,
and each of those answers (the ingress's FastAPI app, without Ray; the running service is
checked in test_http_validation.py)."""

import re

import pytest
from fastapi.testclient import TestClient

from serve_app.ingress import app

# src="…", href="…", ReDoc's spec-url="…" and Swagger UI's `url: '…'` (the OpenAPI document)
_REFERENCE = re.compile(r'(?:src|href|spec-url)="([^"]*)"|\burl: \'([^\']*)\'')
PAGES = {"/docs": "/docs-assets/swagger-ui-bundle.js",
         "/redoc": "/docs-assets/redoc.standalone.js"}


def assert_page_is_self_contained(client, page: str) -> None:
    """`page` answers HTML that names no other host, and every URL it names answers 200."""
    r = client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "//" not in r.text, r.text  # no http://, https:// or protocol-relative //host
    urls = {a or b for a, b in _REFERENCE.findall(r.text)}
    assert PAGES[page] in urls and "/openapi.json" in urls
    for url in sorted(urls):
        assert client.get(url).status_code == 200, url


@pytest.fixture(scope="module")
def app_client():
    with TestClient(app) as client:
        yield client


@pytest.mark.parametrize("page", sorted(PAGES))
def test_docs_pages_load_only_local_assets(app_client, page):
    assert_page_is_self_contained(app_client, page)


def test_swagger_ui_assets_are_javascript_and_css(app_client):
    html = app_client.get("/docs").text
    assert "/docs-assets/swagger-ui.css" in html
    assert app_client.get("/docs-assets/swagger-ui.css").headers["content-type"].startswith(
        "text/css")
    assert "SwaggerUIBundle" in app_client.get("/docs-assets/swagger-ui-bundle.js").text


def test_oauth2_redirect_page_is_still_served(app_client):
    # FastAPI serves it beside its own /docs; Swagger UI's OAuth2 flows come back to it.
    assert app_client.get("/docs/oauth2-redirect").status_code == 200
