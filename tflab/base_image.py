"""The local base image, for hosts with no container registry: debootstrap, pip, docker import.

Built from the distribution's own packages (the host's apt mirror) and pip (the host's
index, proxies and CA bundle). Those settings reach the build as files in a read-only bind
mount (hostsettings.build_files): nothing of them is on a command line or in an
environment that an image would keep, and the image is imported from a tree, never
committed from the container pip ran in.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import docker
import docker.errors
import docker.types

from tflab import config as cfg
from tflab import hostsettings, resources
from tflab.builds import BuildResult, Progress, image_exists, new_log, run_logged
from tflab.errors import EngineError, UserError
from tflab.hostsettings import BUILD_MOUNT, AptMirror, PipSettings

BASE_PACKAGES = (
    "python3", "python3-venv", "openssh-server", "openssh-client", "ca-certificates",
    "procps", "iproute2", "bash", "util-linux", "passwd",
)
EXTRA_PIP = ("tensorboard",)  # TensorFlow 2.20+ no longer brings it; `tflab tensorboard` needs it
VENV = "/opt/tensorflow"
RAW_REPOSITORY = "tflab-base-raw"


def base_tag(gpu: bool) -> str:
    """The local base's tag (the CPU or GPU build of TensorFlow)."""
    return cfg.LOCAL_GPU_BASE if gpu else cfg.LOCAL_BASE


def base_recipe(mirror: AptMirror, package: str) -> str:
    """A short hash of what the local base is made from (a changed recipe rebuilds it)."""
    text = "\n".join([mirror.uri, mirror.suite, *BASE_PACKAGES, package, *EXTRA_PIP, VENV])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def raw_recipe(mirror: AptMirror) -> str:
    """A short hash of the debootstrapped root file system alone."""
    return hashlib.sha256("\n".join([mirror.uri, mirror.suite, *BASE_PACKAGES]).encode()).hexdigest()[:12]


def build_base(
    client: docker.DockerClient, mirror: AptMirror, pip: PipSettings, progress: Progress,
    gpu: bool = False, force: bool = False, tensorflow: str | None = None, tag: str | None = None,
) -> BuildResult:
    """The local base: a debootstrapped system, TensorFlow by pip, and the node's own files, imported once.

    Nothing is committed from a container (each commit walks the whole file system on some
    storage drivers): pip installs into a folder of the host mounted into a throwaway
    container, and the finished tree is imported in one piece.
    """
    tag = tag or base_tag(gpu)
    if ":" not in tag.rsplit("/", 1)[-1]:
        tag += ":latest"
    package = tensorflow or ("tensorflow[and-cuda]" if gpu else "tensorflow-cpu")
    recipe = base_recipe(mirror, package)
    if not force and image_exists(client, tag):
        existing = client.images.get(tag)
        if existing.labels.get("tflab.recipe") == recipe:
            return BuildResult(tag, existing.id, built=False)
        progress.step(f"{tag} was built from another recipe: building it again")
    log_path = new_log("base")
    raw = f"{RAW_REPOSITORY}:{raw_recipe(mirror)}"
    with tempfile.TemporaryDirectory(prefix="tflab-rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        if image_exists(client, raw):
            progress.step("unpacking the debootstrapped system kept from an earlier build")
            _export(client, raw, rootfs)
        else:
            _debootstrap(client, mirror, raw, rootfs, progress, log_path)
        _install_tensorflow(client, raw, rootfs, package, pip, progress, log_path)
        install_node_files(rootfs)
        progress.step(f"importing {tag} into the engine")
        _import(client, rootfs, tag, [
            f"ENV PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            'ENTRYPOINT ["/usr/local/bin/tflab-entrypoint"]',
            f"LABEL tflab.image=base tflab.recipe={recipe} {NODE_FILES_LABEL}={node_files_hash(stock_node_files())}",
        ])
    return BuildResult(tag, client.images.get(tag).id, built=True, log=log_path)


NODE_FILES_LABEL = "tflab.node-files"


def stock_node_files() -> dict[str, bytes]:
    """The node image's own files, as this tflab ships them."""
    return {p.name: p.read_bytes() for p in sorted(resources.path(resources.NODE_IMAGE).iterdir()) if p.is_file()}


def node_files_hash(files: dict[str, bytes]) -> str:
    """A short hash of node files (a base built with them is a node image already)."""
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name] + b"\0")
    return digest.hexdigest()[:16]


def install_node_files(rootfs: Path) -> None:
    """What the node Dockerfile does, done to the tree: sshd's config, the entrypoint, the guard, folders."""
    share = rootfs / "usr" / "local" / "share" / "tflab"
    share.mkdir(parents=True, exist_ok=True)
    for name, content in stock_node_files().items():
        (share / name).write_bytes(content)
        (share / name).chmod(0o755 if name.endswith((".sh", ".py")) else 0o644)
    (rootfs / "etc" / "ssh" / "sshd_config").write_bytes(stock_node_files()["sshd_config"])
    entrypoint = rootfs / "usr" / "local" / "bin" / "tflab-entrypoint"
    entrypoint.write_bytes(stock_node_files()["entrypoint.sh"])
    entrypoint.chmod(0o755)
    for folder in ("workspace", "data", "runs", "run/sshd", "run/tflab"):
        (rootfs / folder).mkdir(parents=True, exist_ok=True)


def _export(client: docker.DockerClient, raw: str, rootfs: Path) -> None:
    """The raw base's tree, unpacked into `rootfs`."""
    rootfs.mkdir(parents=True)
    container = client.containers.create(raw, ["true"], labels={"tflab.build": "base"})
    try:
        untar = subprocess.Popen(["tar", "--numeric-owner", "-x", "-C", str(rootfs)], stdin=subprocess.PIPE)
        assert untar.stdin is not None
        for chunk in container.export():
            untar.stdin.write(chunk)
        untar.stdin.close()
        if untar.wait() != 0:
            raise EngineError(f"cannot unpack {raw}")
    finally:
        container.remove(force=True)


def _import(client: docker.DockerClient, rootfs: Path, tag: str, changes: list[str]) -> None:
    """`rootfs` as one image layer, tagged `tag`, with `changes` (Dockerfile instructions) to its config."""
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
    try:
        repository, version = tag.rsplit(":", 1)
        client.api.import_image(src=tar.stdout, repository=repository, tag=version, changes=changes)
    finally:
        tar.wait()


def _debootstrap(client: docker.DockerClient, mirror: AptMirror, raw: str, rootfs: Path, progress: Progress,
                 log_path: Path) -> None:
    """The distribution's minimal system into `rootfs` (also kept as the raw image, for rebuilds)."""
    if shutil.which("debootstrap") is None:
        raise UserError("debootstrap is not installed; run `apt-get install debootstrap` (as root)")
    if os.geteuid() != 0:
        raise UserError("building the local base needs root (debootstrap); run `sudo tflab base`")
    with log_path.open("a") as log:
        progress.step(f"debootstrap {mirror.suite} from {hostsettings.without_credentials(mirror.uri)}")
        argv = [
            "debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}",
            mirror.suite, str(rootfs), mirror.uri,
        ]
        if run_logged(argv, log, progress) != 0:
            raise EngineError(
                f"debootstrap of {mirror.suite} from {hostsettings.without_credentials(mirror.uri)} failed; "
                "is the mirror reachable? "
                f"log: {log_path}"
            )
    scrub_sources(rootfs)
    for key in (rootfs / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()  # every node makes its own host key when it starts
    for cache in (rootfs / "var" / "cache" / "apt" / "archives").glob("*.deb"):
        cache.unlink()
    progress.step("importing the debootstrapped system into the engine")
    _import(client, rootfs, raw, [])


def scrub_sources(rootfs: Path) -> None:
    """debootstrap keeps the mirror in the tree's apt sources: a password in its address stays on the host."""
    sources = rootfs / "etc" / "apt" / "sources.list"
    if sources.is_file():
        sources.write_text("".join(
            " ".join(hostsettings.without_credentials(word) for word in line.split(" ")) + "\n"
            for line in sources.read_text().splitlines()))


def install_script(package: str) -> str:
    """The build's shell script: proxies from the mounted file, pip configured by the mounted pip.conf."""
    return (
        f"set -e; set -a; . {BUILD_MOUNT}/proxy.env; set +a; "
        f"python3 -m venv {VENV}; "
        f"{VENV}/bin/pip install --no-cache-dir --progress-bar off --disable-pip-version-check "
        f"'{package}' {' '.join(EXTRA_PIP)}; "
        # The wheel's files are there; importing it (seconds of CPU) is left to the first run.
        f"{VENV}/bin/python -c 'import importlib.util as u, sys; sys.exit(u.find_spec(\"tensorflow\") is None)'"
    )


def _install_tensorflow(client: docker.DockerClient, raw: str, rootfs: Path, package: str, pip: PipSettings,
                        progress: Progress, log_path: Path) -> None:
    """pip install TensorFlow into a venv in `rootfs`, mounted into a throwaway container of the raw base."""
    progress.step(f"pip install {package}")
    venv = rootfs / VENV.lstrip("/")
    venv.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tflab-build-") as settings_dir:
        for name, content in hostsettings.build_files(pip).items():
            path = Path(settings_dir, name)
            path.write_bytes(content)
            path.chmod(0o644)
        os.chmod(settings_dir, 0o755)
        container = client.containers.create(
            raw, ["sh", "-c", install_script(package)],
            # Only the file's path: the settings themselves stay in the mount.
            environment={"PIP_CONFIG_FILE": f"{BUILD_MOUNT}/pip.conf"},
            mounts=[docker.types.Mount(BUILD_MOUNT, settings_dir, type="bind", read_only=True),
                    docker.types.Mount(VENV, str(venv), type="bind")],
            labels={"tflab.build": "base"},
        )
        try:
            container.start()
            with log_path.open("a") as log:
                for line in container.logs(stream=True, follow=True):
                    text = line.decode(errors="replace")
                    log.write(text)
                    if text.strip():
                        progress.detail(text.strip())
            status = container.wait()
            if status.get("StatusCode", 1) != 0:
                tail = container.logs(tail=3).decode(errors="replace").strip().splitlines()
                hint = tail[-1] if tail else "no output"
                advice = " (pass the CA bundle your network needs with --ca-bundle)" if "certificate" in hint.lower() else ""
                raise EngineError(f"pip install {package} in the base failed: {hint}{advice}; log: {log_path}")
        finally:
            container.remove(force=True)
