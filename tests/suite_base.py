"""The suite's one build of the local base, made with a secret in its pip settings.

Every Docker test starts from tflab's local base. Where the suite builds it (scripts/test.sh does, beside the
unit tests; else the first test that needs it), the build is handed a credential-bearing pip setting and a
secret proxy exception, as a user behind a mirror or a proxy hands them, and the build's record keeps that
secret: test_docker_secrets then checks the very image every other test ran on, instead of building a second
base of its own (that test took 113 s here with its own base, 48 s with this one). Where the base was there
before the suite started, nothing here knows what it was built with: the record says so, and the secrets test
builds its own.

    python tests/suite_base.py RECORD    # build (or find) the base; write RECORD (JSON)
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

RECORD_ENV = "TFLAB_TESTS_BASE_RECORD"  # scripts/test.sh's record, read by every pytest session it starts
TAG = "tflab-base:cpu"


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def secret_settings(secret: str, port: int) -> dict[str, str]:
    """Settings that carry `secret` and leave a build working: pip skips a dead link, no proxy is set."""
    return {
        "PIP_FIND_LINKS": f"http://tflab:{secret}@127.0.0.1:{port}/wheels",
        "PIP_RETRIES": "0",
        "NO_PROXY": f"localhost,{secret}.invalid",
    }


def build(record: Path, tag: str = TAG, timeout: float = 1500,
          started: Callable[[subprocess.Popen], None] = lambda child: None) -> dict:
    """`tflab base` with a fresh secret in its settings; the record: the tag, its image id, and, when this call
    built it, the secret, the dead link's port and the build's log (None otherwise)."""
    secret, port = f"s3cr3t-{uuid.uuid4().hex}", closed_port()
    env = {**os.environ, **secret_settings(secret, port)}
    with subprocess.Popen([sys.executable, "-m", "tflab", "base", "--tag", tag], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env) as child:
        started(child)
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            raise RuntimeError(f"tflab base did not end in {timeout:.0f} s") from None
    if child.returncode != 0:
        raise RuntimeError(f"tflab base failed: {err[-2000:]}")
    built = "log: " in out
    image = image_id(tag)
    if not image:
        raise RuntimeError(f"tflab base ended well, but the engine has no {tag}")
    facts = {"tag": tag, "image": image, "secret": secret if built else None, "port": port if built else None,
             "log": out.split("log: ")[1].strip() if built else None}
    record.write_text(json.dumps(facts))
    return facts


def recorded(record: Path) -> dict | None:
    """The record at `record` while its image is still the tag's (else None: the base was built again since)."""
    try:
        facts = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    return facts if image_id(facts["tag"]) == facts["image"] else None


def image_id(tag: str) -> str:
    """The engine's id of `tag` ("" when it has no such image)."""
    return subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", tag], capture_output=True,
                          text=True).stdout.strip()


def main(record: Path) -> int:
    # scripts/test.sh stops the build with SIGTERM, which `tflab base` unwinds on (its container and tree gone):
    # it is passed on. A terminal's Ctrl-C reaches the whole group, tflab's own included: this one waits for it.
    building: list[subprocess.Popen] = []

    def pass_on(signum: int, _frame) -> None:
        for child in building:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, pass_on)
    signal.signal(signal.SIGHUP, pass_on)
    signal.signal(signal.SIGINT, lambda _signum, _frame: None)
    try:
        made = build(record, started=building.append)
    except RuntimeError as exc:
        print(f"suite_base: {exc}", file=sys.stderr)
        return 1
    print(f"{made['tag']} ({made['image'][7:19]}) " + ("built, with a secret in its pip settings" if made["log"]
                                                        else "was there already (test_docker_secrets builds its own)"))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
