"""``pgpool web``'s settings, and the checks made before anything is served (no aiohttp
here: the CLI checks these first, and says in one line when the extra is missing)."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from typing import Final

from ..errors import ConfigError
from ..horizon import HORIZON_WARN

#: The environment variables that turn on HTTP basic authentication.
USER_VARIABLE: Final = "PGPOOL_WEB_USER"
PASSWORD_VARIABLE: Final = "PGPOOL_WEB_PASSWORD"
#: What the CLI says when aiohttp is not installed.
MISSING_EXTRA: Final = "pgpool web needs the web extra: pip install 'pgpool[web]'"
#: What every refused action answers in read-only mode.
READ_ONLY: Final = "read-only: start `pgpool web --read-write` to allow actions"


@dataclass(frozen=True)
class WebConfig:
    dsn: str
    host: str = "127.0.0.1"
    port: int = 8080
    read_write: bool = False
    allow_payloads: bool = False
    #: Basic auth credentials; None: no authentication (only sensible on loopback).
    user: str | None = None
    password: str | None = None
    #: ``--horizon-warn``, seconds; None: no warning.
    horizon_warn: float | None = HORIZON_WARN

    @property
    def auth(self) -> bool:
        return self.user is not None

    @property
    def loopback(self) -> bool:
        return is_loopback(self.host)

    def check(self) -> None:
        """`ConfigError` if actions or payloads would be served to the network unprotected."""
        if self.auth or self.loopback:
            return
        exposed = [flag for flag, on in (("--read-write", self.read_write),
                                         ("--allow-payloads", self.allow_payloads)) if on]
        if exposed:
            raise ConfigError(
                f"refusing {' and '.join(exposed)} on {self.host}, which is not a loopback "
                f"address, without authentication: set {USER_VARIABLE} and "
                f"{PASSWORD_VARIABLE}, or serve on 127.0.0.1")


def credentials() -> tuple[str | None, str | None]:
    """(user, password) from the environment; both or neither, else `ConfigError`."""
    user = os.environ.get(USER_VARIABLE) or None
    password = os.environ.get(PASSWORD_VARIABLE) or None
    if (user is None) != (password is None):
        given, missing = ((USER_VARIABLE, PASSWORD_VARIABLE) if user
                          else (PASSWORD_VARIABLE, USER_VARIABLE))
        raise ConfigError(f"{given} is set but {missing} is not: set both to require a "
                          "login, or neither")
    if user is not None and ":" in user:
        raise ConfigError(f"{USER_VARIABLE} holds a colon, which HTTP basic authentication "
                          "cannot carry in a user name: choose another name")
    return user, password


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address or ``localhost``) is reachable from this machine only."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to any interface
