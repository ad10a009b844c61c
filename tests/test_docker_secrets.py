"""Secrets handed to a build (pip settings, proxies) never enter an image.

The base checked is the suite's own (suite_base.py builds it with a secret in its pip settings) where this
run built it; a base that was there before gets a build of its own here, with the same settings."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest
import suite_base
from conftest import cli

# No lab: it builds, saves and reads images (scripts/test.sh runs it with the image tests, beside the swarm tests).
pytestmark = [pytest.mark.docker, pytest.mark.slow, pytest.mark.waits, pytest.mark.builds]


def saved_images_hold(needles: list[bytes], *images: str) -> set[bytes]:
    """Which of `needles` are anywhere in `docker save` of `images` (every layer's files, config, history; a
    layer they share is saved, and read, once)."""
    child = subprocess.Popen(["docker", "save", *images], stdout=subprocess.PIPE)
    assert child.stdout is not None
    tail, found, longest = b"", set(), max(len(n) for n in needles)
    for chunk in iter(lambda: child.stdout.read(1 << 20), b""):
        found |= {needle for needle in needles if needle in tail + chunk}
        tail = chunk[-longest:]
    assert child.wait() == 0
    return found


# In every node image (its entrypoint's name, in a layer and in the config): what the scan must find.
PRESENT = b"/usr/local/bin/tflab-entrypoint"


def test_pip_settings_and_proxies_given_to_a_build_stay_out_of_the_images(labs, runner, docker_client, base_build,
                                                                          tmp_path: Path, monkeypatch) -> None:
    # Under a name of its own (in the lab's Dockerfile too), the base gets a real node image build, with the proxies.
    tag = f"tflab-base:secret-test-{uuid.uuid4().hex[:8]}"
    images = [tag]
    try:
        if base_build["secret"]:
            facts = base_build
            docker_client.images.get(facts["image"]).tag(*tag.rsplit(":", 1))
        else:  # the base was there before this run: build one with the suite's settings
            facts = suite_base.build(tmp_path / "base.json", tag=tag, timeout=1800)
        secret, port = facts["secret"], facts["port"]
        assert facts["log"] and secret and port, facts
        # The build used the setting (pip shows the link with its password masked) ...
        assert f"tflab:****@127.0.0.1:{port}/wheels" in Path(facts["log"]).read_text()
        lab = labs.gen("--base", tag, nodes=1)
        # The node image's Dockerfile build gets the host's proxies (for its apt-get), credentials and all.
        monkeypatch.setenv("HTTPS_PROXY", f"http://tflab:{secret}@127.0.0.1:{port}")
        monkeypatch.setenv("http_proxy", f"http://tflab:{secret}@127.0.0.1:{port}")
        built = runner.invoke(cli, ["build", "--lab", str(lab)])
        assert built.exit_code == 0, built.stderr
        node = built.stdout.split()[1]
        assert node.startswith("tflab-node:") and docker_client.images.get(node).id != facts["image"], built.stdout
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
        assert saved_images_hold([secret.encode(), PRESENT], *images) == {PRESENT}, f"the secret is in {images}"
    finally:
        for image in reversed(images):
            subprocess.run(["docker", "rmi", image], capture_output=True)  # a tag of the suite's base: only the tag
