"""Small helpers for doing things in every node at once."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def parallel(fn: Callable[[T], R], items: Iterable[T], name: str = "tflab") -> list[R]:
    """`[fn(x) for x in items]`, all at once in daemon threads (an interrupted wait leaves them be).

    The first exception any call raised is raised here, once every call has ended.
    """
    items = list(items)
    results: list[R | None] = [None] * len(items)
    errors: list[BaseException] = []

    def call(index: int, item: T) -> None:
        try:
            results[index] = fn(item)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i, item), daemon=True, name=f"{name}-{i}")
               for i, item in enumerate(items)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results  # type: ignore[return-value]
