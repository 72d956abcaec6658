"""The browser page: `/` (chat and a digits tab) and its assets under `/ui/`, read from the package.

The page is plain HTML and ES modules with no build step (`gateway/static/`). It calls the
gateway's own routes by relative URLs, so it works from whatever host, port or path prefix
the gateway is reached at. The Content-Security-Policy allows scripts, styles and requests
from this origin only: no inline script, no CDN, no other host.
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

from engines.errors import ErrorKind, SluiceError

router = APIRouter(include_in_schema=False)

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# blob: and data: images are the digit the user uploads and its 8x8 preview.
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_HEADERS = {
    "Content-Security-Policy": _CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidate on every load, so a page from an older gateway is never mixed with a newer one's API.
    "Cache-Control": "no-cache",
}


def _load() -> dict[str, tuple[bytes, str]]:
    """Every asset by file name, read once: a fixed set, so no client path reaches the file system."""
    assets = {}
    for entry in (resources.files("gateway") / "static").iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _TYPES:
            assets[entry.name] = (entry.read_bytes(), _TYPES[suffix])
    return assets


_ASSETS = _load()


def _serve(name: str) -> Response:
    asset = _ASSETS.get(name)
    if asset is None:
        raise SluiceError(f"no page asset named {name!r}", ErrorKind.NOT_FOUND)
    body, media_type = asset
    return Response(body, media_type=media_type, headers=_HEADERS)


@router.api_route("/", methods=["GET", "HEAD"])
async def index() -> Response:
    return _serve("index.html")


@router.api_route("/ui/{name}", methods=["GET", "HEAD"])
async def asset(name: str) -> Response:
    return _serve(name)
