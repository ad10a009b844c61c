"""Host ports: is one free to publish, and does what is published there answer?"""

from __future__ import annotations

import socket
import time
import urllib.request
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


MAX_PORT = 65535


def first_free_base(host: str, start: int, count: int, check: PortCheck | None = None,
                    avoid: Iterable[int] = ()) -> int:
    """The first base from `start` on whose `count` ports are all free on `host` now (and none of `avoid`): where a
    lab takes its ports when none were given, so that a second lab beside the first just works."""
    check = check or port_free
    skipped = set(avoid)
    base = start
    while base + count - 1 <= MAX_PORT:
        taken = next((port for port in range(base, base + count) if port in skipped or not check(host, port)), None)
        if taken is None:
            return base
        base = taken + 1
    raise UserError(f"no {count} free ports in a row from {start} on {host}: free some, or pass a base of your own "
                    "(--ssh-port-base, --tensorboard-port-base)")


def wait_for_http(url: str, deadline: float) -> bool:
    """Wait until `url` answers 200, or `deadline` passes."""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except (OSError, ValueError):
            pass
        time.sleep(0.3)
    return False


def wait_for_ssh(host: str, port: int, deadline: float) -> bool:
    """Wait until an SSH server answers its banner on host:port, or `deadline` passes."""
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1) as sock:
                sock.settimeout(2)
                if sock.recv(16).startswith(b"SSH-"):
                    return True
        except OSError:
            pass
        time.sleep(0.05)
    return False
