"""Links between nodes that behave like a cluster's: a rate (tbf) and a delay (netem), pure.

Each node shapes its own link on the lab network when it starts, both ways, as a NIC holds its
rate (images/node/shape.sh, from the variables `environment` sets: a tbf on what it sends, and
one on an ifb device that what it receives is redirected to); tflab checks beforehand, with the same script in a
throwaway container, that the host kernel has every qdisc a lab asks for, so nothing is
ever silently unshaped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tflab.errors import UserError

RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
RATE_PATTERN = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$")
MAX_DELAY_MS = 60_000.0
MIN_DELAY_MS = 0.001  # tc's delays are in microseconds


@dataclass(frozen=True)
class Links:
    """How every node's traffic on the lab network is shaped (nothing when both are None)."""

    rate: str | None = None  # tc's spelling, e.g. 100mbit
    delay_ms: float | None = None

    def __bool__(self) -> bool:
        return self.rate is not None or self.delay_ms is not None

    @property
    def qdiscs(self) -> tuple[str, ...]:
        """The queueing disciplines the host kernel must offer for these links."""
        return (("netem",) if self.delay_ms else ()) + (("tbf",) if self.rate else ())

    def describe(self) -> str:
        """`100mbit, 5 ms delay`, or `unshaped`."""
        parts = []
        if self.rate:
            parts.append(self.rate)
        if self.delay_ms:
            parts.append(f"{self.delay_ms:g} ms delay")
        return ", ".join(parts) or "unshaped"


MAX_RATE_BITS = 100e9


def parse_rate(text: str, flag: str = "--link-rate") -> str:
    """A link rate as tc writes it (`100mbit`, `1gbit`, `10gbit`); a UserError otherwise."""
    normalised = str(text).strip().lower()
    match = RATE_PATTERN.match(normalised)
    if not match:
        raise UserError(
            f"{flag} {text!r} is not a rate: write a number and a unit, such as 100mbit, 1gbit or 10gbit"
        )
    if float(match.group(1)) * RATE_UNITS[match.group(2)] < 8000:
        raise UserError(f"{flag} {text!r} is too slow for a link: use at least 8kbit")
    if float(match.group(1)) * RATE_UNITS[match.group(2)] > MAX_RATE_BITS:
        raise UserError(f"{flag} {text!r} is faster than tc shapes a link: use at most 100gbit")
    return normalised


def rate_bits(rate: str) -> float:
    """Bits per second of a rate `parse_rate` accepted."""
    match = RATE_PATTERN.match(rate)
    assert match, rate
    return float(match.group(1)) * RATE_UNITS[match.group(2)]


def parse_delay(value: float | int | str, flag: str = "--link-delay") -> float | None:
    """A one-way delay in milliseconds (0 means none); a UserError for anything else."""
    try:
        delay = float(value)
    except (TypeError, ValueError):
        raise UserError(f"{flag} {value!r} is not a number of milliseconds") from None
    if delay != delay or delay < 0 or delay > MAX_DELAY_MS:  # NaN, negative, absurd
        raise UserError(f"{flag} {value!r} must be between 0 and {MAX_DELAY_MS:g} milliseconds")
    if 0 < delay < MIN_DELAY_MS:  # tc's delay is in microseconds (and 1e-09 would be written in exponent form)
        raise UserError(f"{flag} {value!r} is below a microsecond, the finest delay tc sets: use 0 or at least 0.001")
    return round(delay, 3) or None


def burst_bytes(rate: str) -> int:
    """tbf's bucket: at least one rate/100 s worth (the kernel's timer tick must not starve it)."""
    return max(32 * 1024, int(rate_bits(rate) / 8 / 100))


def environment(links: Links) -> dict[str, str]:
    """What the node entrypoint reads to shape its link (empty for an unshaped lab)."""
    env: dict[str, str] = {}
    if links.rate:
        env["TFLAB_LINK_RATE"] = links.rate
        env["TFLAB_LINK_BURST"] = str(burst_bytes(links.rate))
    if links.delay_ms:
        env["TFLAB_LINK_DELAY_MS"] = f"{links.delay_ms:g}"
    return env


def missing_qdisc_advice(qdisc: str, error: str) -> str:
    """The sentence `up` and `doctor` say when the kernel lacks a qdisc the lab asks for."""
    flag = "--link-delay" if qdisc == "netem" else "--link-rate"
    detail = error.strip().splitlines()[-1] if error.strip() else "refused"
    return (
        f"this host's kernel has no {qdisc} qdisc ({detail}), which {flag} needs; load it "
        f"(modprobe sch_{qdisc}) or generate the lab without {flag}"
    )
