"""Doing one thing in every node at once: the one place tflab makes threads.

- `parallel(fn, items)`: `[fn(x) for x in items]` at once, at most `limit` at a time; every
  call ends before it returns, and every item's error is reported (compose v1's
  `parallel_execute`).
- `each(fn, items)`: the same, handing back each item's value or error instead of raising.
- `merged(streams)`: several iterators read at once, their items in arrival order.
- `background(fn)`: a call that goes on by itself (stopping a node while others are judged).

Threads are daemons: an interrupted wait (Ctrl-C) never waits for them at exit.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from tflab.errors import TflabError

T = TypeVar("T")
R = TypeVar("R")
DEFAULT_LIMIT = 16


@dataclass(frozen=True)
class Outcome(Generic[T, R]):
    """One item's result: its value, or the error its call raised."""

    item: T
    value: R | None = None
    error: BaseException | None = None


class FanOutError(TflabError):
    """Several items failed: each one's error, by item."""

    def __init__(self, errors: Mapping[str, BaseException]) -> None:
        self.errors = dict(errors)
        self.exit_code = max((getattr(e, "exit_code", 1) for e in self.errors.values()), default=1)
        super().__init__("; ".join(f"{label}: {error}" for label, error in self.errors.items()))


def each(fn: Callable[[T], R], items: Iterable[T], *, limit: int = DEFAULT_LIMIT,
         name: str = "tflab") -> list[Outcome[T, R]]:
    """Call `fn` on every item, at most `limit` at once; each item's value or error, in item order."""
    items = list(items)
    outcomes: list[Outcome[T, R] | None] = [None] * len(items)
    slots = threading.BoundedSemaphore(max(1, limit))

    def call(index: int, item: T) -> None:
        try:
            outcomes[index] = Outcome(item, value=fn(item))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, by item
            outcomes[index] = Outcome(item, error=exc)
        finally:
            slots.release()

    threads = []
    for index, item in enumerate(items):
        slots.acquire()
        thread = threading.Thread(target=call, args=(index, item), daemon=True, name=f"{name}-{index}")
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join()
    return outcomes  # type: ignore[return-value]


def parallel(fn: Callable[[T], R], items: Iterable[T], *, limit: int = DEFAULT_LIMIT, name: str = "tflab") -> list[R]:
    """`[fn(x) for x in items]`, at once; when calls fail, their errors are raised once every call has ended.

    One failed item raises its own error; several raise a FanOutError naming each item.
    """
    outcomes = each(fn, items, limit=limit, name=name)
    failed = [o for o in outcomes if o.error is not None]
    if len(failed) == 1:
        raise failed[0].error  # type: ignore[misc]
    if failed:
        raise FanOutError({str(o.item): o.error for o in failed if o.error is not None})
    return [o.value for o in outcomes]  # type: ignore[misc]


_END = object()


def merged(streams: Mapping[str, Iterable[Any]]) -> Iterator[tuple[str, Any]]:
    """(name, item) from every stream as items come; ends when every stream has (an error in one ends it too)."""
    inbox: queue.SimpleQueue = queue.SimpleQueue()

    def pump(name: str, stream: Iterable[Any]) -> None:
        try:
            for item in stream:
                inbox.put((name, item))
        except BaseException as exc:  # noqa: BLE001 - raised in the reader's thread
            inbox.put((name, exc))
        finally:
            inbox.put((name, _END))

    for name, stream in streams.items():
        threading.Thread(target=pump, args=(name, stream), daemon=True, name=f"stream-{name}").start()
    open_streams = len(streams)
    while open_streams:
        name, item = inbox.get()
        if item is _END:
            open_streams -= 1
        elif isinstance(item, BaseException):
            raise item
        else:
            yield name, item


def background(fn: Callable[..., Any], *args: Any, name: str = "tflab") -> threading.Thread:
    """Run `fn(*args)` on its own; the caller does not wait (its errors are its own to handle)."""
    thread = threading.Thread(target=fn, args=args, daemon=True, name=name)
    thread.start()
    return thread
