"""The web playground: a self-contained page, and the one endpoint it adds.

``PlaygroundRoutes`` serves

- ``GET /`` (a 307 to ``/playground``) and ``GET /playground``: the page, whose
  files (``playground_files/``: HTML, CSS and plain JavaScript modules, no build
  step) are package data read once at start-up; nothing is fetched from
  elsewhere at run time, and the page's ``Content-Security-Policy`` forbids it
  for scripts, styles and images (``connect-src`` stays open: the page may
  stream from any OpenAI-compatible base URL typed into it, which the other
  server must allow with CORS, see ``cors.py``);
- ``GET /playground/{name}``: those files (404 for any other name);
- ``GET /engine/requests``: the newest ended requests of the ledger, newest
  first, as ``{"object": "list", "data": [row, ...]}``; ``?limit=N`` (1 to
  ``MAX_RECENT``, default ``DEFAULT_RECENT``), ``?id=RESPONSE_ID`` for one
  request (an empty list while it runs or when it is older than the ledger's
  memory). Each row has ``LedgerRow``'s fields; times are Unix seconds.

The page needs no key but answers only to the ``Host`` names of a keyless route
(``access.py``); ``/engine/requests`` is an operator route, guarded like
``/engine/stats`` (it lists every key's requests).

Spec: docs/playground.md; W3C, "Content Security Policy Level 3".
"""

from __future__ import annotations

import dataclasses
from importlib import resources
from itertools import islice

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from sluicegate.core.errors import RequestError
from sluicegate.server.admission.access import PAGE_PATH
from sluicegate.server.http.answers import error_answer, json_answer
from sluicegate.server.http.errors import RouteNotFound
from sluicegate.server.ledger.ledger import Ledger, LedgerRow

__all__ = [
    "DEFAULT_RECENT",
    "MAX_RECENT",
    "PlaygroundRoutes",
    "row_payload",
]

DEFAULT_RECENT = 20
MAX_RECENT = 100

_FILES_PACKAGE = "sluicegate.server.app"
_FILES_FOLDER = "playground_files"
_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
}
_HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        "connect-src *; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "cache-control": "no-cache",
    "referrer-policy": "no-referrer",
}


def row_payload(row: LedgerRow) -> dict[str, object]:
    """``row`` as JSON fields (end state and finish reasons as wire strings)."""
    payload = dataclasses.asdict(row)
    payload["end_state"] = str(row.end_state)
    payload["finish_reasons"] = [r and str(r) for r in row.finish_reasons]
    return payload


class PlaygroundRoutes:
    """The page, its files, and the recent requests of ``ledger``; the files
    are read here, once."""

    def __init__(
        self, ledger: Ledger, retry_after_s: int, shared: bool = False
    ) -> None:
        self._ledger = ledger
        self._retry_after_s = retry_after_s
        # serve --workers: the rows in memory are one worker's; the file or
        # database has every worker's.
        self._shared = shared and ledger.durable
        self._files = _read_files()

    async def root(self, request: Request) -> Response:
        return RedirectResponse(PAGE_PATH)  # 307

    async def page(self, request: Request) -> Response:
        return self._file(request, "index.html")

    async def asset(self, request: Request) -> Response:
        return self._file(request, request.path_params["name"])

    async def recent_requests(self, request: Request) -> Response:
        """``GET /engine/requests``; 400 naming ``limit`` when it is not an
        integer from 1 to ``MAX_RECENT``."""
        try:
            limit = _limit(request.query_params.get("limit"))
        except RequestError as exc:
            return error_answer(exc)
        wanted = request.query_params.get("id")
        if self._shared:
            picked = await self._ledger.read_newest(limit, wanted)
            return json_answer(
                {"object": "list", "data": [row_payload(r) for r in picked[::-1]]}
            )
        rows = self._ledger.rows  # a copy: the newest ``limit`` are read from it
        if wanted is not None:
            found = self._ledger.find(wanted)
            picked = [] if found is None else [found]
        else:
            picked = list(islice(reversed(rows), limit))
        return json_answer({"object": "list", "data": [row_payload(r) for r in picked]})

    def _file(self, request: Request, name: str) -> Response:
        found = self._files.get(name)
        if found is None:  # as the router answers an unknown path
            return error_answer(RouteNotFound(request.method, request.url.path))
        body, media_type = found
        return Response(body, headers=_HEADERS, media_type=media_type)


def _limit(value: str | None) -> int:
    if value is None:
        return DEFAULT_RECENT
    # ASCII digits, a few: str.isdigit() took "²" and 5,000 digits, on which
    # int() raised ValueError (a 500).
    if not (value.isascii() and value.isdigit() and len(value) <= 10) or not (
        1 <= int(value) <= MAX_RECENT
    ):
        raise RequestError(
            f"limit must be an integer from 1 to {MAX_RECENT}, got {value[:32]!r}",
            param="limit",
            code="invalid_limit",
        )
    return int(value)


def _read_files() -> dict[str, tuple[bytes, str]]:
    """Every page file by name, with its media type."""
    folder = resources.files(_FILES_PACKAGE).joinpath(_FILES_FOLDER)
    files: dict[str, tuple[bytes, str]] = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rpartition(".")[2]
        if entry.is_file() and suffix in _MEDIA_TYPES:
            files[entry.name] = (entry.read_bytes(), _MEDIA_TYPES[suffix])
    return files
