"""Host ports: is one free to publish?"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable

from tflab.errors import UserError

PortCheck = Callable[[str, int], bool]


def port_free(host: str, port: int) -> bool:
    """Whether `port` on `host` can be bound now (nothing listens there)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def require_free(
    host: str, wanted: Iterable[tuple[str, str, int]], check: PortCheck | None = None
) -> None:
    """Raise a UserError naming the first (node, what, port) whose port is taken."""
    check = check or port_free
    for node, what, port in wanted:
        if not check(host, port):
            raise UserError(
                f"port {host}:{port} ({what} of {node}) is already in use; free it or pass "
                f"--{'ssh' if what == 'SSH' else 'tensorboard'}-port-base with another base"
            )
