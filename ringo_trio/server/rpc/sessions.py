"""Negotiated sessions: random tokens with a fixed expiry, held in memory.

Tokens deliberately do not survive a restart: a restarted daemon may serve a
different minor, so every client must negotiate again, and the SDK does so
on the ``OUT_OF_RANGE`` it gets for an unknown token.

Sessions all get the same TTL and the clock only moves forward in the normal
case, so insertion order is expiry order: expired sessions are pruned from
the front of an ordered dict in amortized O(1), and the table is capped so a
client that negotiates in a loop cannot grow it without bound.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timedelta

__all__ = ["Session", "SessionTable"]


@dataclass(frozen=True, slots=True)
class Session:
    minor: int
    expires_at: datetime


class SessionTable:
    def __init__(self, ttl: timedelta, *, max_sessions: int = 100_000) -> None:
        if ttl <= timedelta(0):
            raise ValueError("session ttl must be positive")
        self.ttl = ttl
        self._max = max_sessions
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def open(self, minor: int, now: datetime) -> str:
        self._prune(now)
        while len(self._sessions) >= self._max:
            # Evicting the oldest only shortens a session; its owner
            # renegotiates on the next call, which is always safe.
            self._sessions.popitem(last=False)
        token = secrets.token_urlsafe(24)
        self._sessions[token] = Session(minor=minor, expires_at=now + self.ttl)
        return token

    def lookup(self, token: str, now: datetime) -> Session | None:
        """The live session for `token`, or None if unknown or expired."""
        session = self._sessions.get(token) if token else None
        if session is None:
            return None
        if now >= session.expires_at:
            del self._sessions[token]
            return None
        return session

    def _prune(self, now: datetime) -> None:
        while self._sessions:
            token, session = next(iter(self._sessions.items()))
            if now < session.expires_at:
                return
            del self._sessions[token]
