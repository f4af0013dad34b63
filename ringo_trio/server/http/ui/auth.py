"""Who may use the dashboard: the daemon's bearer token, or a signed session.

A browser logs in once with the token and then carries a cookie holding a
*session*: a random id and an expiry, signed with HMAC-SHA256 under a key
the daemon draws at start (so a restart logs everyone out, and the token
itself never leaves the login request). Scripts send ``Authorization:
Bearer TOKEN`` instead. The CSRF token of a session is derived from it
(HMAC of its id under the same key), so the daemon stores no session state
at all. A daemon without a token is open, as its gRPC port is; it still
hands out sessions, because actions need their CSRF token.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets
import time

from ..server import BadRequest

__all__ = ["COOKIE", "SESSION_SECONDS", "Sessions"]

COOKIE = "ringo_session"
SESSION_SECONDS = 12 * 3600
_SCHEME = "bearer "


def _b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


class Sessions:
    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None
        self._key = secrets.token_bytes(32)

    @property
    def open(self) -> bool:
        """No token configured: everyone may use the dashboard."""
        return self._token is None

    def token_matches(self, presented: str) -> bool:
        if self._token is None:
            return True
        return hmac.compare_digest(presented.encode("utf-8", "surrogatepass"), self._token)

    def bearer(self, header: str | None) -> bool | None:
        """None: no Authorization header; else whether it carries the token."""
        if header is None:
            return None
        scheme, token = header[: len(_SCHEME)], header[len(_SCHEME) :]
        return scheme.lower() == _SCHEME and self.token_matches(token.strip())

    def _mac(self, purpose: bytes, text: str) -> str:
        return _b64(hmac.new(self._key, purpose + text.encode(), hashlib.sha256).digest())

    def new(self, now: float | None = None) -> tuple[str, str]:
        """(session id, cookie value) of a fresh session."""
        sid = _b64(secrets.token_bytes(16))
        expires = int((time.time() if now is None else now) + SESSION_SECONDS)
        body = f"{sid}.{expires}"
        return sid, f"{body}.{self._mac(b'session:', body)}"

    def session(self, cookie: str | None, now: float | None = None) -> str | None:
        """The session id in a valid, unexpired cookie value."""
        if not cookie or len(cookie) > 200:
            return None
        body, _, mac = cookie.rpartition(".")
        sid, _, expires = body.partition(".")
        if not sid or not expires.isdigit():
            return None
        if not hmac.compare_digest(
            mac.encode("utf-8", "surrogatepass"), self._mac(b"session:", body).encode()
        ):
            return None
        if int(expires) <= (time.time() if now is None else now):
            return None
        return sid

    def csrf(self, sid: str) -> str:
        return self._mac(b"csrf:", sid)

    def csrf_matches(self, sid: str, presented: str) -> bool:
        return hmac.compare_digest(presented.encode(), self.csrf(sid).encode())


def cookie_value(header: str | None) -> str | None:
    """The session cookie's value in a Cookie header.

    Raises `BadRequest` when the session cookie's value is not cookie text
    (RFC 6265 ``cookie-value``: printable ASCII but space, ``"``, ``,``,
    ``;`` and backslash, optionally in double quotes). Other cookies are not
    looked at: a browser sends the dashboard the cookies of every other
    service on its host name, whatever they hold.
    """
    if not header:
        return None
    for part in header.split(";"):
        name, _, value = part.strip().partition("=")
        if name == COOKIE:
            if not _COOKIE_VALUE.fullmatch(value):
                raise BadRequest(f"malformed {COOKIE} cookie")
            return value.removeprefix('"').removesuffix('"')
    return None


_COOKIE_VALUE = re.compile(r'"?[\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*"?')
