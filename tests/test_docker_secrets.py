"""Secrets handed to a build (pip settings, proxies) never enter an image."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import cli

pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.waits]


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def saved_image_holds(image: str, needle: bytes) -> bool:
    """Whether `needle` is anywhere in `docker save` of `image` (every layer's files, config, history)."""
    child = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE)
    assert child.stdout is not None
    tail = b""
    found = False
    for chunk in iter(lambda: child.stdout.read(1 << 20), b""):
        if needle in tail + chunk:
            found = True
        tail = chunk[-len(needle):]
    assert child.wait() == 0
    return found


def test_pip_settings_and_proxies_given_to_a_build_stay_out_of_the_images(labs, runner, docker_client,
                                                                          tmp_path: Path, monkeypatch) -> None:
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    port = closed_port()
    tag = f"tflab-base:secret-test-{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        # A credential-bearing setting that does not break the build: pip skips a dead link.
        "PIP_FIND_LINKS": f"http://tflab:{secret}@127.0.0.1:{port}/wheels",
        "PIP_RETRIES": "0",
        "NO_PROXY": f"localhost,{secret}.invalid",
    }
    images = [tag]
    try:
        done = subprocess.run([sys.executable, "-m", "tflab", "base", "--tag", tag], env=env, capture_output=True,
                              text=True, timeout=1800)
        assert done.returncode == 0, done.stderr[-3000:]
        log = Path(done.stdout.split("log: ")[1].strip())
        # The build used the setting (pip shows the link with its password masked) ...
        assert f"tflab:****@127.0.0.1:{port}/wheels" in log.read_text()
        lab = labs.gen("--base", tag, nodes=1)
        # The node image's Dockerfile build gets the host's proxies (for its apt-get), credentials and all.
        monkeypatch.setenv("HTTPS_PROXY", f"http://tflab:{secret}@127.0.0.1:{port}")
        monkeypatch.setenv("http_proxy", f"http://tflab:{secret}@127.0.0.1:{port}")
        built = runner.invoke(cli, ["build", "--lab", str(lab)])
        assert built.exit_code == 0, built.stderr
        node = built.stdout.split()[1]
        assert node.startswith("tflab-node:")
        images.append(node)
        # ... and no image keeps it: not in history, not in the config, not in any layer.
        for image in images:
            history = subprocess.run(["docker", "history", "--no-trunc", image], capture_output=True, text=True,
                                     check=True).stdout
            assert "Imported from -" in history  # the base is one imported tree (the node image's first layer)
            assert secret not in history, f"{image}: the secret is in docker history"
            inspected = json.dumps(docker_client.api.inspect_image(image))
            assert secret not in inspected, f"{image}: the secret is in docker inspect"
            assert "PIP_FIND_LINKS" not in inspected and "NO_PROXY" not in inspected and "HTTPS_PROXY" not in inspected
            assert not saved_image_holds(image, secret.encode()), f"{image}: the secret is in a layer"
    finally:
        for image in reversed(images):
            subprocess.run(["docker", "rmi", "-f", image], capture_output=True)
