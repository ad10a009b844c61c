"""The local base image, for hosts with no container registry: mmdebstrap/debootstrap, pip, docker import.

Built from the distribution's own packages (the host's apt mirror) and pip (the host's
index, proxies and CA bundle). Those settings reach the build as files in a read-only bind
mount (buildsettings.build_files): nothing of them is on a command line or in an
environment that an image would keep, and the image is imported from a tree, never
committed from the container pip ran in.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from subprocess import Popen  # the type of what proc.start returns

import docker
import docker.errors
import docker.types

from tflab.engine.builds import BuildResult, Progress, follow, image_exists, new_log, run_logged, settings_mount
from tflab.errors import EngineError, UserError
from tflab.host import buildsettings, proc
from tflab.host.buildsettings import BUILD_MOUNT, AptMirror, PipSettings
from tflab.plan import config as cfg
from tflab.render import image_files

BASE_PACKAGES = (
    "python3", "python3-venv", "openssh-server", "openssh-client", "ca-certificates",
    "procps", "iproute2", "iptables", "bash", "util-linux", "passwd",
)
EXTRA_PIP = ("tensorboard",)  # TensorFlow 2.20+ no longer brings it; `tflab tensorboard` needs it
VENV = "/opt/tensorflow"
RAW_REPOSITORY = "tflab-base-raw"
WHEELS_MOUNT = "/run/tflab-wheels"


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
    """The local base: a bootstrapped system, TensorFlow by pip, and the node's own files, imported once.

    Nothing is committed from a container (each commit walks the whole file system on some
    storage drivers): pip installs into a folder of the host mounted into a throwaway
    container, and the finished tree is imported in one piece.
    """
    tag = tag or cfg.local_base(gpu)
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
        # The wheels download on the host while the system is bootstrapped (both wait on the network).
        prefetch = WheelPrefetch.start(Path(tmp) / "wheels", [package, *EXTRA_PIP], pip, mirror)
        try:
            if image_exists(client, raw):
                progress.step("unpacking the bootstrapped system kept from an earlier build")
                _export(client, raw, rootfs)
            else:
                _bootstrap(client, mirror, raw, rootfs, progress, log_path)
        except BaseException:
            if prefetch:
                prefetch.cancel()
            raise
        wheels = prefetch.finish(log_path) if prefetch else None
        _install_tensorflow(client, raw, rootfs, package, pip, progress, log_path, wheels)
        install_node_files(rootfs)
        progress.step(f"importing {tag} into the engine")
        _import(client, rootfs, tag, [
            f"ENV PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "ENV LANG=C.UTF-8",
            'ENTRYPOINT ["/usr/local/bin/tflab-entrypoint"]',
            f"LABEL tflab.image=base tflab.recipe={recipe} {NODE_FILES_LABEL}={image_files.files_hash(image_files.node_files())}",
        ])
    return BuildResult(tag, client.images.get(tag).id, built=True, log=log_path)


NODE_FILES_LABEL = "tflab.node-files"


def install_node_files(rootfs: Path) -> None:
    """What the node Dockerfile does, done to the tree: sshd's config, the entrypoint, the guard, folders."""
    files = image_files.node_files()
    share = rootfs / "usr" / "local" / "share" / "tflab"
    share.mkdir(parents=True, exist_ok=True)
    for name, content in files.items():
        (share / name).write_bytes(content)
        (share / name).chmod(0o755 if name.endswith((".sh", ".py", ".pyz")) or name == "py-spy" else 0o644)
    (rootfs / "etc" / "ssh" / "sshd_config").write_bytes(files["sshd_config"])
    entrypoint = rootfs / "usr" / "local" / "bin" / "tflab-entrypoint"
    entrypoint.write_bytes(files["entrypoint.sh"])
    entrypoint.chmod(0o755)
    for folder in ("workspace", "data", "runs", "run/sshd", "run/tflab"):
        (rootfs / folder).mkdir(parents=True, exist_ok=True)


def _export(client: docker.DockerClient, raw: str, rootfs: Path) -> None:
    """The raw base's tree, unpacked into `rootfs`."""
    rootfs.mkdir(parents=True)
    container = client.containers.create(raw, ["true"], labels={"tflab.build": "base"})
    try:
        with proc.spawned(["tar", "--numeric-owner", "-x", "-C", rootfs], stdin=proc.PIPE,
                          stderr=proc.PIPE) as untar:
            assert untar.stdin is not None and untar.stderr is not None
            try:
                for chunk in container.export():
                    untar.stdin.write(chunk)
                untar.stdin.close()
            except BrokenPipeError:
                pass  # tar stopped reading: its exit code and message say why
            if untar.wait() != 0:
                raise EngineError(f"cannot unpack {raw}: {untar.stderr.read().decode(errors='replace').strip()}")
    finally:
        container.remove(force=True)


def _import(client: docker.DockerClient, rootfs: Path, tag: str, changes: list[str]) -> None:
    """`rootfs` as one image layer, tagged `tag`, with `changes` (Dockerfile instructions) to its config."""
    repository, version = tag.rsplit(":", 1)
    with proc.spawned(["tar", "--numeric-owner", "-C", rootfs, "-c", "."], stdout=proc.PIPE) as tar:
        try:
            client.api.import_image(src=tar.stdout, repository=repository, tag=version, changes=changes)
        except docker.errors.APIError as exc:
            raise EngineError(f"the engine would not import {tag}: {exc.explanation or exc}") from exc
    if tar.returncode != 0:
        raise EngineError(f"cannot pack the tree of {tag} (tar exited with {tar.returncode})")


BOOTSTRAP_TOOLS = ("mmdebstrap", "debootstrap")  # mmdebstrap first: one apt run, about a third faster


def bootstrap_tool(which: Callable[[str], str | None] = shutil.which) -> str:
    """The tool that makes the minimal system: mmdebstrap where installed, else debootstrap."""
    for tool in BOOTSTRAP_TOOLS:
        if which(tool) is not None:
            return tool
    raise UserError("neither mmdebstrap nor debootstrap is installed; run `apt-get install mmdebstrap` (as root)")


def _bootstrap(client: docker.DockerClient, mirror: AptMirror, raw: str, rootfs: Path, progress: Progress,
               log_path: Path) -> None:
    """The distribution's minimal system into `rootfs` (also kept as the raw image, for rebuilds)."""
    tool = bootstrap_tool()
    if os.geteuid() != 0:
        raise UserError(f"building the local base needs root ({tool}); run `sudo tflab base`")
    where = buildsettings.without_credentials(mirror.uri)
    with log_path.open("a") as log:
        progress.step(f"{tool} {mirror.suite} from {where}")
        argv = [tool, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", mirror.suite, str(rootfs),
                mirror.uri]
        if run_logged(argv, log, progress) != 0:
            raise EngineError(f"{tool} of {mirror.suite} from {where} failed; is the mirror reachable? log: {log_path}")
    scrub_sources(rootfs)
    for key in (rootfs / "etc" / "ssh").glob("ssh_host_*"):
        key.unlink()  # every node makes its own host key when it starts
    for cache in (rootfs / "var" / "cache" / "apt" / "archives").glob("*.deb"):
        cache.unlink()
    progress.step("importing the bootstrapped system into the engine")
    _import(client, rootfs, raw, [])


def scrub_sources(rootfs: Path) -> None:
    """The bootstrap keeps the mirror in the tree's apt sources: a password in its address stays on the host."""
    sources = rootfs / "etc" / "apt" / "sources.list"
    if sources.is_file():
        sources.write_text("".join(
            " ".join(buildsettings.without_credentials(word) for word in line.split(" ")) + "\n"
            for line in sources.read_text().splitlines()))


def target_python_is_ours(mirror: AptMirror, os_release: str, system_python: Path) -> bool:
    """Whether the base's Python will be this interpreter's version (so wheels fetched here fit it).

    True when this host runs the release the base is made of (its apt sources name it) and
    that release's python3 has this interpreter's version.
    """
    codename = re.search(r"^VERSION_CODENAME=\"?([\w.-]+)\"?$", os_release, re.MULTILINE)
    return (codename is not None and codename.group(1) == mirror.suite
            and system_python.resolve().name == f"python{sys.version_info[0]}.{sys.version_info[1]}")


@dataclass
class WheelPrefetch:
    """`pip download` on the host of what the base installs, beside the bootstrap."""

    folder: Path
    child: Popen
    log: Path

    @classmethod
    def start(cls, folder: Path, packages: list[str], pip: PipSettings, mirror: AptMirror) -> WheelPrefetch | None:
        try:
            os_release = Path("/etc/os-release").read_text()
        except OSError:
            return None
        if not target_python_is_ours(mirror, os_release, Path("/usr/bin/python3")):
            return None  # the base's Python differs: its own pip fetches everything
        folder.mkdir(parents=True)
        log = folder.with_suffix(".log")
        env = {**os.environ, **pip.env, **({"PIP_CERT": str(pip.ca_bundle)} if pip.ca_bundle else {})}
        with log.open("w") as out:
            child = proc.start(
                [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off",
                 "--only-binary", ":all:", "-d", folder, *packages],
                stdin=proc.DEVNULL, stdout=out, stderr=proc.STDOUT, env=env)
        return cls(folder, child, log)

    def cancel(self) -> None:
        """The build stopped: so does the download."""
        self.child.kill()
        self.child.wait()

    def finish(self, log_path: Path) -> Path | None:
        """The folder of wheels when every one came, else None (the base's pip then uses the index)."""
        code = self.child.wait()
        with log_path.open("a") as log:
            log.write(f"--- wheels fetched on the host beside the bootstrap (exit {code}) ---\n")
            log.write(self.log.read_text(errors="replace"))
        return self.folder if code == 0 else None


# The build's script, a constant: every value reaches it as an argument ($1..), never inside its text.
#   $1 the settings mount (proxy.env, pip.conf), $2 the venv, $3 the wheels fetched on the host (or ""),
#   then the pip requirements.
INSTALL_SCRIPT = (
    'set -e; set -a; . "$1/proxy.env"; set +a; venv=$2; wheels=$3; shift 3; '
    'python3 -m venv "$venv"; '
    'pip_install() { "$venv/bin/pip" install --no-cache-dir --progress-bar off --disable-pip-version-check "$@"; }; '
    'if [ -n "$wheels" ]; then pip_install --no-index --find-links "$wheels" "$@" || pip_install "$@"; '
    'else pip_install "$@"; fi; '
    # The wheel's files are there; importing it (seconds of CPU) is left to the first run.
    '"$venv/bin/python" -c \'import importlib.util as u, sys; sys.exit(u.find_spec("tensorflow") is None)\''
)


def install_argv(package: str, wheels: bool = False) -> list[str]:
    """The build's command: proxies from the mounted file, pip configured by the mounted pip.conf.

    With `wheels`, the wheels fetched on the host are installed first (no index); should they
    not fit this Python after all, pip installs from the index as without them.
    """
    return ["sh", "-c", INSTALL_SCRIPT, "tflab-base", BUILD_MOUNT, VENV, WHEELS_MOUNT if wheels else "",
            package, *EXTRA_PIP]


def _install_tensorflow(client: docker.DockerClient, raw: str, rootfs: Path, package: str, pip: PipSettings,
                        progress: Progress, log_path: Path, wheels: Path | None = None) -> None:
    """pip install TensorFlow into a venv in `rootfs`, mounted into a throwaway container of the raw base."""
    progress.step(f"pip install {package}")
    venv = rootfs / VENV.lstrip("/")
    venv.mkdir(parents=True, exist_ok=True)
    with settings_mount(pip) as settings:
        container = client.containers.create(
            raw, install_argv(package, wheels=wheels is not None),
            # Only the file's path: the settings themselves stay in the mount.
            environment={"PIP_CONFIG_FILE": f"{BUILD_MOUNT}/pip.conf"},
            mounts=[settings, docker.types.Mount(VENV, str(venv), type="bind"),
                    *([docker.types.Mount(WHEELS_MOUNT, str(wheels), type="bind", read_only=True)] if wheels else [])],
            labels={"tflab.build": "base"},
        )
        try:
            if follow(container, log_path, progress) != 0:
                tail = container.logs(tail=3).decode(errors="replace").strip().splitlines()
                hint = tail[-1] if tail else "no output"
                advice = " (pass the CA bundle your network needs with --ca-bundle)" if "certificate" in hint.lower() else ""
                raise EngineError(f"pip install {package} in the base failed: {hint}{advice}; log: {log_path}")
        finally:
            container.remove(force=True)
