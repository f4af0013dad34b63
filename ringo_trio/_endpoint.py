"""Endpoint strings → (host, port, tls): pure parsing, no I/O.

Accepted forms: ``host``, ``host:port``, ``[v6]``, ``[v6]:port``, each
optionally prefixed by ``grpc://`` / ``http://`` (plaintext) or ``grpcs://`` /
``https://`` (TLS), with at most one trailing ``/``. How to do TLS (which
CAs to trust, which client certificate to present) is not part of the
string: `Endpoint.with_tls` attaches it. The default port is
`ringo_trio._limits.DEFAULT_PORT`. Anything else is an `InvalidArgumentError`
raised before any network activity, naming what is wrong.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import ssl
from dataclasses import dataclass, field

from ._contract.limits import DEFAULT_PORT
from ._errors import InvalidArgumentError

_SCHEMES = {"grpc": False, "http": False, "grpcs": True, "https": True}
# RFC 3986 reg-name characters we accept in a host: DNS names and IPv4.
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_")


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int
    tls: bool
    # None with tls: the system trust store, no client certificate.
    tls_context: ssl.SSLContext | None = field(default=None, compare=False, repr=False)

    def with_tls(self, context: ssl.SSLContext) -> Endpoint:
        """This endpoint over TLS as `context` says (CAs, client certificate)."""
        return dataclasses.replace(self, tls=True, tls_context=context)

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{'grpcs' if self.tls else 'grpc'}://{self.authority}"


def parse_endpoint(endpoint: object) -> Endpoint:
    if not isinstance(endpoint, str):
        raise InvalidArgumentError(f"endpoint must be a string, got {type(endpoint).__name__}")
    if not endpoint:
        raise InvalidArgumentError("endpoint is required")
    rest = endpoint
    tls = False
    scheme, sep, after = rest.partition("://")
    if sep:
        if scheme.lower() not in _SCHEMES:
            raise InvalidArgumentError(
                f"endpoint {endpoint!r}: unsupported scheme {scheme!r};"
                " expected grpc://, grpcs://, http:// or https://"
            )
        tls = _SCHEMES[scheme.lower()]
        rest = after
    if rest.endswith("/"):
        rest = rest[:-1]
    for bad, what in (("/", "a path"), ("?", "a query"), ("#", "a fragment"), ("@", "userinfo")):
        if bad in rest:
            raise InvalidArgumentError(f"endpoint {endpoint!r} must not contain {what}")
    if not rest:
        raise InvalidArgumentError(f"endpoint {endpoint!r} has no host")

    if rest.startswith("["):
        close = rest.find("]")
        if close < 0:
            raise InvalidArgumentError(f"endpoint {endpoint!r}: unterminated '[' in IPv6 host")
        host = rest[1:close]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise InvalidArgumentError(
                f"endpoint {endpoint!r}: {host!r} is not an IPv6 address"
            ) from None
        tail = rest[close + 1 :]
        if tail and not tail.startswith(":"):
            raise InvalidArgumentError(f"endpoint {endpoint!r}: unexpected {tail!r} after ']'")
        port_text = tail[1:] if tail else None
    else:
        if rest.count(":") > 1:
            raise InvalidArgumentError(
                f"endpoint {endpoint!r}: write an IPv6 host in brackets, e.g. [::1]:7233"
            )
        host, colon, port_text_raw = rest.partition(":")
        port_text = port_text_raw if colon else None
        if not host:
            raise InvalidArgumentError(f"endpoint {endpoint!r} has no host")
        if not set(host) <= _HOST_CHARS:
            raise InvalidArgumentError(f"endpoint {endpoint!r}: invalid host {host!r}")

    if port_text is None:
        port = DEFAULT_PORT
    else:
        if not port_text.isascii() or not port_text.isdigit():
            raise InvalidArgumentError(f"endpoint {endpoint!r}: port {port_text!r} is not a number")
        port = int(port_text)
        if not 1 <= port <= 65535:
            raise InvalidArgumentError(f"endpoint {endpoint!r}: port {port} is out of range")
    return Endpoint(host=host, port=port, tls=tls)
