"""The node image on a real engine: built from the local base, no key inside, sshd by key only."""

from __future__ import annotations

import re
import subprocess
import tarfile
from pathlib import Path

import pytest
from conftest import cli, node_image_of

pytestmark = [pytest.mark.docker, pytest.mark.waits]


@pytest.mark.builds  # no lab: builds, saves and reads images
def test_second_build_does_no_work(labs, runner) -> None:
    lab = labs.gen(nodes=1)
    first = runner.invoke(cli, ["build", "--force", "--lab", str(lab)])
    assert first.exit_code == 0, first.stderr
    assert first.stdout.startswith("built tflab-node:"), first.stdout
    tag = first.stdout.split()[1]
    built_id = labs.client.images.get(tag).id
    assert built_id[7:19] in first.stdout
    second = runner.invoke(cli, ["build", "--lab", str(lab)])
    assert second.exit_code == 0, second.stderr
    assert second.stdout.startswith(f"{tag} is up to date ({built_id[7:19]})"), second.stdout
    assert labs.client.images.get(tag).id == built_id


# Key blocks with their base64 body (binaries that merely name the marker do not count).
# OpenSSH keys count anywhere; other PEM keys where a system keeps its own (libraries such
# as gnutls embed self-test keys, which are no secret of the lab's).
OPENSSH_KEY = re.compile(rb"-----BEGIN OPENSSH PRIVATE KEY-----\r?\n[A-Za-z0-9+/=]{40}")
PEM_KEY = re.compile(rb"-----BEGIN [A-Z ]*PRIVATE KEY-----\r?\n[A-Za-z0-9+/=]{40}")


def _layer_files(image_tar: Path):
    """(path, bytes) of every regular file in every layer of a `docker save` archive."""
    with tarfile.open(image_tar) as outer:
        for member in outer.getmembers():
            if not member.name.endswith("layer.tar"):
                continue
            layer = outer.extractfile(member)
            with tarfile.open(fileobj=layer, mode="r|") as inner:
                for item in inner:
                    if item.isfile():
                        handle = inner.extractfile(item)
                        yield item.name.removeprefix("./"), handle.read() if handle else b""


@pytest.mark.builds  # no lab: builds, saves and reads images
def test_saved_image_holds_no_private_key_and_no_root_password(labs, runner, tmp_path: Path) -> None:
    lab = labs.gen(nodes=1)
    built = runner.invoke(cli, ["build", "--lab", str(lab)])
    assert built.exit_code == 0, built.stderr
    tag = node_image_of(built.stdout)
    saved = tmp_path / "image.tar"
    subprocess.run(["docker", "save", "-o", str(saved), tag], check=True)
    # The key's last line of base64 before its footer holds private key bytes unique to this key
    # (its first lines are the same fixed header in every unencrypted ed25519 key).
    key_lines = (lab / "keys" / "id_ed25519").read_text().splitlines()
    assert key_lines[-1] == "-----END OPENSSH PRIVATE KEY-----"
    lab_key = key_lines[-2].encode()
    assert len(lab_key) >= 20
    shadow_root = []
    for name, content in _layer_files(saved):
        assert not OPENSSH_KEY.search(content), f"SSH private key material in {name}"
        if name.startswith(("etc/", "root/", "home/", "workspace/", "usr/local/share/tflab/")):
            assert not PEM_KEY.search(content), f"private key material in {name}"
        assert lab_key not in content, f"the lab's key is in {name}"
        assert not Path(name).name.startswith("ssh_host_"), f"a baked host key: {name}"
        if name == "etc/shadow":
            shadow_root = [line for line in content.decode().splitlines() if line.startswith("root:")]
    assert shadow_root, "no /etc/shadow in the image"
    for line in shadow_root:
        assert line.split(":")[1] in ("*", "!", "!*", ""), f"root has a password hash: {line}"
        assert line.split(":")[1] != "", "root has an empty password"


def ssh(lab: Path, port: int, *options: str, command: str = "hostname") -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-p", str(port), "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
         "-o", "BatchMode=yes", "-o", "ConnectTimeout=10", *options, "root@127.0.0.1", command],
        capture_output=True, text=True, timeout=60,
    )


def test_node_runs_tensorflow_and_sshd_takes_the_key_and_refuses_passwords(labs, runner) -> None:
    from tflab.host import labfiles

    lab = labs.gen(nodes=1)
    up = runner.invoke(cli, ["up", "--lab", str(lab)])
    assert up.exit_code == 0, up.stderr
    imported = runner.invoke(cli, ["exec", "--lab", str(lab), "worker0", "--", "python", "-c",
                                   "import tensorflow as tf; print('tf', tf.__version__)"])
    assert imported.exit_code == 0, imported.stderr
    assert imported.stdout.startswith("tf 2.")
    port = labfiles.open_lab(lab).lab.node("worker0").ssh_port
    key = str(lab / "keys" / "id_ed25519")
    by_key = ssh(lab, port, "-i", key, "-o", "IdentitiesOnly=yes")
    assert by_key.returncode == 0, by_key.stderr
    assert by_key.stdout.strip() == "worker0"
    by_password = ssh(lab, port, "-o", "PubkeyAuthentication=no",
                      "-o", "PreferredAuthentications=password,keyboard-interactive")
    assert by_password.returncode == 255
    assert "Permission denied (publickey)" in by_password.stderr
    settings = runner.invoke(cli, ["exec", "--lab", str(lab), "worker0", "--", "/usr/sbin/sshd", "-T"])
    assert "passwordauthentication no" in settings.stdout
    assert "permitrootlogin without-password" in settings.stdout


@pytest.mark.builds  # no lab: builds, saves and reads images
def test_bake_puts_the_code_and_data_in_an_image_for_clusters(labs, runner, docker_client) -> None:
    import uuid

    lab = labs.gen(nodes=2)
    tag = f"tflab-baked-test:{uuid.uuid4().hex[:8]}"
    try:
        baked = runner.invoke(cli, ["build", "--bake", "--tag", tag, "--lab", str(lab)])
        assert baked.exit_code == 0, baked.stderr
        assert baked.stdout.startswith(f"baked {tag} (") and f"--image {tag}" in baked.stdout
        listing = docker_client.containers.run(tag, ["sh", "-c", "ls /workspace /data"], entrypoint=[], remove=True)
        assert b"mnist_async.py" in listing and b"digits.npz" in listing
        again = runner.invoke(cli, ["build", "--bake", "--tag", tag, "--lab", str(lab)])
        assert again.stdout.startswith(f"up to date: {tag}")
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)
