"""What makes the console safe to leave running: authentication (a bearer token or HTTP basic
credentials, compared in constant time, or the embedding application's own), per-action
permissions, CSRF tokens with a ``Sec-Fetch-Site`` check on every POST, and the response headers
(a Content-Security-Policy without inline script, ``X-Frame-Options: DENY``).

References: OWASP Cross-Site Request Forgery Prevention Cheat Sheet (signed double-submit cookie,
Fetch Metadata headers); MDN, Sec-Fetch-Site; RFC 7617 (HTTP Basic), RFC 6750 (Bearer tokens).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import inspect
import os
import secrets
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import PlainTextResponse

#: Every action the console can take; a permission hook answers with a subset of these.
ACTIONS = frozenset({
    "pause", "resume", "cancel", "due_now", "redrive", "purge", "configure", "schedule_pause", "schedule_resume",
})

#: The Content-Security-Policy of every response: only the console's own files, no inline script
#: or style, no framing, forms only to the console itself.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
)

#: Environment variables holding the console's own credentials.
TOKEN_ENV = "PGDELAYQ_CONSOLE_TOKEN"
USER_ENV = "PGDELAYQ_CONSOLE_USER"
PASSWORD_ENV = "PGDELAYQ_CONSOLE_PASSWORD"

CSRF_COOKIE = "pgdelayq_csrf"
CSRF_FIELD = "csrf_token"

#: ``authenticate(request)`` -> the user's name, or None to answer 401; may be a coroutine function.
Authenticate = Callable[[Request], "str | None | Awaitable[str | None]"]
#: ``permissions(user)`` -> "all", "read-only", or the set of :data:`ACTIONS` the user may take.
Permissions = Callable[["str | None"], "str | Collection[str]"]


class Unauthorized(Exception):
    """No or wrong credentials (answered 401)."""


@dataclass(frozen=True)
class Credentials:
    """The console's own credentials: a bearer token, or a user name and password (HTTP basic)."""

    token: str | None = None
    user: str | None = None
    password: str | None = None

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Credentials | None:
        """Read :data:`TOKEN_ENV`, or :data:`USER_ENV` and :data:`PASSWORD_ENV`; None when unset.

        :raises ValueError: only one of the user name and the password is set, or a value is empty.
        """
        env = os.environ if environ is None else environ
        token, user, password = env.get(TOKEN_ENV), env.get(USER_ENV), env.get(PASSWORD_ENV)
        if token is not None:
            if not token:
                raise ValueError(f"{TOKEN_ENV} is empty")
            return cls(token=token)
        if user is None and password is None:
            return None
        if not user or not password:
            raise ValueError(f"set both {USER_ENV} and {PASSWORD_ENV}, not one of them, and neither empty")
        return cls(user=user, password=password)

    def __call__(self, request: Request) -> str | None:
        """The user a request's ``Authorization`` header names (the token's user is "token"), or None."""
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if self.token is not None:
            ok = scheme == "bearer" and hmac.compare_digest(value.encode(), self.token.encode())
            return "token" if ok else None
        if scheme != "basic":
            return None
        try:
            user, _, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        # Both compared, whatever the first gives, so the time does not tell which was wrong.
        ok_user = hmac.compare_digest(user.encode(), (self.user or "").encode())
        ok_password = hmac.compare_digest(password.encode(), (self.password or "").encode())
        return user if ok_user and ok_password else None

    @property
    def challenge(self) -> str:
        return 'Bearer realm="pgdelayq"' if self.token is not None else 'Basic realm="pgdelayq", charset="UTF-8"'


async def authenticated_user(authenticate: Authenticate | None, request: Request) -> str | None:
    """The user of ``request`` as ``authenticate`` says (None when there is no hook: anonymous).

    :raises Unauthorized: the hook answered None.
    """
    if authenticate is None:
        return None
    user = authenticate(request)
    if inspect.isawaitable(user):
        user = await user
    if user is None:
        raise Unauthorized
    return str(user)


def allowed_actions(allow_actions: bool, permissions: Permissions | None, user: str | None) -> frozenset[str]:
    """The actions ``user`` may take: none on a read-only console; else what ``permissions`` grants
    (all of them without a hook).

    :raises ValueError: the hook answered something other than "all", "read-only" or a set of actions.
    """
    if not allow_actions:
        return frozenset()
    if permissions is None:
        return ACTIONS
    granted = permissions(user)
    if granted == "all":
        return ACTIONS
    if granted == "read-only":
        return frozenset()
    if isinstance(granted, str) or not set(granted) <= ACTIONS:
        raise ValueError(f"permissions({user!r}) returned {granted!r}: give 'all', 'read-only' or a subset of "
                         f"{sorted(ACTIONS)}")
    return frozenset(granted)


class Csrf:
    """Signed double-submit CSRF tokens: a random cookie (HttpOnly, SameSite=Strict) and, in every
    form, the HMAC of that cookie under this process's secret."""

    def __init__(self, secret: bytes | None = None) -> None:
        self.secret = secret or secrets.token_bytes(32)

    @staticmethod
    def new_cookie() -> str:
        return secrets.token_urlsafe(32)

    def token(self, cookie: str) -> str:
        return hmac.new(self.secret, cookie.encode(), hashlib.sha256).hexdigest()

    def valid(self, cookie: str | None, token: str | None) -> bool:
        if not cookie or not token:
            return False
        return hmac.compare_digest(self.token(cookie).encode(), token.encode())


def same_origin(headers: Headers) -> bool:
    """Whether a browser says the request came from this site's own pages (``Sec-Fetch-Site`` is
    same-origin) or from the user directly (none). Requests without the header are refused too."""
    return headers.get("sec-fetch-site") in ("same-origin", "none")


def unauthorized(challenge: str | None) -> PlainTextResponse:
    headers = {"WWW-Authenticate": challenge} if challenge else {}
    return PlainTextResponse("401 Unauthorized: this console needs credentials.\n", 401, headers=headers)


def is_loopback(host: str) -> bool:
    """Whether ``host`` (as given to ``--host``) is a loopback address or ``localhost``."""
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def describe(value: Any) -> str:
    """A short printable form of a form value for the audit log."""
    text = str(value)
    return text if len(text) <= 200 else text[:200] + "…"
