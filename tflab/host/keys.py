"""The lab's SSH key pair, made on the host and injected into nodes when they start."""

from __future__ import annotations

from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey


@dataclass(frozen=True)
class KeyPair:
    """An OpenSSH key pair as text."""

    private: str
    public: str


def new_key_pair(comment: str) -> KeyPair:
    """A fresh ed25519 key pair in OpenSSH format."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode()
    return KeyPair(private=private, public=f"{public} {comment}\n")
