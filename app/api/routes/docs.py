"""The API's documentation pages, /docs (Swagger UI) and /redoc, with the scripts
and styles they load served from here (the copies the fastapi-offline package
keeps), so they work on a network without the internet. FastAPI's own pages
load them from a CDN."""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, Request, Response
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import FileResponse, HTMLResponse
from starlette.exceptions import HTTPException

from app.auth.access import scopes

ASSETS = Path(fastapi_offline.__file__).parent / "static"
_TYPES = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "redoc.standalone.js": "text/javascript",
    "favicon.png": "image/png",
}
ASSET_PATHS = frozenset(f"/docs/assets/{name}" for name in _TYPES)
"""Open to anyone, keys or not: the pages' code, nothing of a queue (a browser
sends no API key for a script it loads)."""

OAUTH2_REDIRECT = "/docs/oauth2-redirect"

router = APIRouter(include_in_schema=False)


@router.get("/docs", **scopes("any"))
async def swagger_ui(request: Request) -> HTMLResponse:
    app = request.app
    return get_swagger_ui_html(
        openapi_url=app.openapi_url,
        title=f"{app.title} - Swagger UI",
        swagger_js_url="/docs/assets/swagger-ui-bundle.js",
        swagger_css_url="/docs/assets/swagger-ui.css",
        swagger_favicon_url="/docs/assets/favicon.png",
        oauth2_redirect_url=OAUTH2_REDIRECT,
        swagger_ui_parameters=app.swagger_ui_parameters,
    )


@router.get(OAUTH2_REDIRECT, **scopes("any"))
async def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc", **scopes("any"))
async def redoc(request: Request) -> HTMLResponse:
    app = request.app
    return get_redoc_html(
        openapi_url=app.openapi_url,
        title=f"{app.title} - ReDoc",
        redoc_js_url="/docs/assets/redoc.standalone.js",
        redoc_favicon_url="/docs/assets/favicon.png",
        with_google_fonts=False,  # fonts from Google: not on an offline network either
    )


@router.get("/docs/assets/{name}")
async def asset(name: str) -> Response:
    media_type = _TYPES.get(name)
    if media_type is None:
        raise HTTPException(404)
    return FileResponse(
        ASSETS / name, media_type=media_type,
        headers={"cache-control": "public, max-age=86400"},
    )
