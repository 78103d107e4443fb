"""Who may call which route: API keys, admin keys, and the ``Host`` of open routes.

``Access.check(scope)`` runs before routing, on every HTTP request. Routes fall in
four classes:

- probes, ``/health`` and ``/ready``: always open (probes carry no key), never
  checked;
- operator routes, ``/metrics``, ``/engine/stats`` and ``/engine/requests``: an
  admin key when any is configured; without one they are open while no API key
  is configured either, and refused (403, ``admin_key_required``) once one is:
  ``/engine/stats`` lists every tenant's request ids, so an API key does not
  open it;
- the playground page, ``/``, ``/playground`` and its files: never a key (a
  browser cannot send one for a page), always the ``Host`` check below;
- API routes, everything else (``/v1/*``, ``/openapi.json``, unknown paths): an
  API key when any is configured.

A route that answers without a key checks ``Host`` (when ``allowed_hosts`` is
not ``None``, which ``serve`` always sets): a web page the user visits can make
the browser call a local server, and after a DNS rebinding (its own name now
resolving to 127.0.0.1) read the answers; its requests then carry the page's
own name as ``Host``. So a keyless route accepts only IP literals (an IP origin
is the server itself, never a page elsewhere), ``localhost`` and its
subdomains (which browsers resolve to loopback without DNS), and the names
configured (``--host`` and ``--allowed-host``; ``*`` accepts any); anything else
gets 421. A request without ``Host`` (HTTP/1.0) does not come from a browser
and passes. The other half of that attack, a cross-site ``text/plain`` POST that
needs no preflight, is refused with 415 by ``bodies.read_json_object``.

Invariants:
    - A refusal here happens before routing: no ledger row and no body read;
      the app counts it in ``sluicegate_refused_requests_total`` by ``code``, a
      bounded set (``REFUSAL_CODES``).
    - Keys are compared with ``admission.bearer_key`` (every key, constant
      time); the key found goes to the route in ``scope[API_KEY]``.

Spec: RFC 9110, "7.2. Host and :authority" and "15.5.20. 421 Misdirected
Request"; RFC 6761, "6.3. Domain Name Reservation Considerations for
'localhost.'"; WHATWG Fetch, "CORS-safelisted request-header" (text/plain needs
no preflight).
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable

from starlette.datastructures import Headers
from starlette.types import Scope

from sluicegate.server.admission.keys import Admission, ApiKey, bearer_key
from sluicegate.server.http.errors import Forbidden, HostNotAllowed

__all__ = [
    "API_KEY",
    "OPERATOR_PATHS",
    "PAGE_PATH",
    "PROBE_PATHS",
    "REFUSAL_CODES",
    "Access",
    "is_page_path",
]

API_KEY = "sluicegate.api_key"
"""The scope key holding the request's ``ApiKey`` (``None`` without API keys)."""

PROBE_PATHS = frozenset({"/health", "/ready"})
OPERATOR_PATHS = frozenset({"/metrics", "/engine/stats", "/engine/requests"})
PAGE_PATH = "/playground"
"""The playground page (``playground.py``); its files are under ``PAGE_PATH/``."""

REFUSAL_CODES = (
    "missing_api_key",
    "invalid_api_key",
    "missing_admin_key",
    "invalid_admin_key",
    "admin_key_required",
    "host_not_allowed",
)
"""Every ``code`` of a refusal by ``Access.check``."""

_ANY_HOST = "*"


class Access:
    """The route access rules of one server.

    Args:
        admission: authenticates API keys (``Admission.authenticate``).
        api_keyed: whether any API key is configured.
        admin_keys: keys of the operator routes; empty: see the module docstring.
        allowed_hosts: names accepted as ``Host`` by keyless routes besides IP
            literals and ``localhost`` names (case-insensitive, a port ignored);
            ``None``: no ``Host`` check.
    """

    def __init__(
        self,
        admission: Admission,
        *,
        api_keyed: bool,
        admin_keys: Iterable[ApiKey] = (),
        allowed_hosts: Iterable[str] | None = None,
    ) -> None:
        self._admission = admission
        self._api_keyed = api_keyed
        self._admin_keys = tuple(admin_keys)
        self._hosts = (
            None
            if allowed_hosts is None
            else frozenset(h.strip().lower().rstrip(".") for h in allowed_hosts)
        )

    def check(self, scope: Scope) -> ApiKey | None:
        """The request's API key, or ``None`` where the route needs none.

        Raises:
            Unauthenticated: a key is needed and missing or wrong (401).
            Forbidden: an operator route while only API keys are configured
                (403, ``admin_key_required``).
            HostNotAllowed: a keyless route under another ``Host`` name (421).
        """
        path: str = scope["path"]
        if path in PROBE_PATHS:
            return None
        if is_page_path(path):
            self._check_host(scope)
            return None
        if path in OPERATOR_PATHS:
            if self._admin_keys:
                bearer_key(Headers(scope=scope), self._admin_keys, "admin")
                return None
            if self._api_keyed:
                raise Forbidden(
                    "This route needs an admin key, and the server has none "
                    "(start it with --admin-key)",
                    "admin_key_required",
                )
            self._check_host(scope)
            return None
        if not self._api_keyed:
            self._check_host(scope)
            return None
        return self._admission.authenticate(Headers(scope=scope))

    def _check_host(self, scope: Scope) -> None:
        hosts = self._hosts
        if hosts is None or _ANY_HOST in hosts:
            return
        for name, value in scope["headers"]:
            if name == b"host":
                host = _host_name(value.decode("latin-1"))
                if not (_always_allowed(host) or host in hosts):
                    raise HostNotAllowed(
                        "This server does not answer to that Host name; start it "
                        "with --allowed-host NAME to add one, or with --api-key",
                        "host_not_allowed",
                    )
                return


def is_page_path(path: str) -> bool:
    """Whether ``path`` is the playground page, one of its files, or ``/``."""
    return path in ("/", PAGE_PATH) or path.startswith(PAGE_PATH + "/")


def _host_name(value: str) -> str:
    """``Host`` without its port, lower-case, without a trailing dot."""
    value = value.strip().lower()
    if value.startswith("["):  # [v6]:port
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


@functools.lru_cache(maxsize=256)
def _always_allowed(host: str) -> bool:
    # Once per keyless request: parsing an IP literal costs about 15 us, and
    # a server is asked by a few names (a bounded cache: Host is the client's).
    if not host or host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(host.partition("%")[0])
    except ValueError:
        return False
    return True
