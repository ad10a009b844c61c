"""The node image: TensorFlow, an SSH server and tflab's guard, on the lab's base image."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

import docker
import docker.errors
from docker.utils import parse_repository_tag

from tflab.engine.builds import BuildResult, Progress, image_exists, new_log
from tflab.errors import EngineError
from tflab.host.filetree import manifest
from tflab.plan import config as cfg


def resolve_base(choice: str, has_gpus: bool, client: docker.DockerClient, tensorflow: str | None = None) -> str:
    """The base image a lab's `image.base` means here.

    `auto` is the official TensorFlow image when the engine has it or its registry answers,
    else the local base that tflab builds itself (`tflab base`). `official` and `local`
    name those; anything else is an image name used as it is.
    """
    if choice != cfg.AUTO_BASE:
        return cfg.base_name(choice, has_gpus, tensorflow)
    official, local = cfg.official_base(has_gpus, tensorflow), cfg.local_base(has_gpus, tensorflow)
    if image_exists(client, official):
        return official
    if image_exists(client, local):
        return local
    return official if registry_reachable(client, official) else local


def registry_reachable(client: docker.DockerClient, image: str) -> bool:
    """Whether the engine can reach the registry of `image` (asks for its manifest, pulls nothing)."""
    try:
        client.api.inspect_distribution(image)
    except Exception:  # noqa: BLE001 - any failure means: no registry for us
        return False
    return True


def is_local_base(image: str) -> bool:
    """Whether `image` is a base that `tflab base` builds (a pinned TensorFlow's too)."""
    return image in (cfg.LOCAL_BASE, cfg.LOCAL_GPU_BASE) or image.startswith((f"{cfg.LOCAL_BASE}-tf",
                                                                              f"{cfg.LOCAL_GPU_BASE}-tf"))


def tar_context(files: dict[str, bytes]) -> io.BytesIO:
    """A build context as an in-memory tar (the context is a few small files)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        folders = sorted({str(parent) for name in files for parent in PurePosixPath(name).parents if str(parent) != "."})
        for folder in folders:  # a folder before what it holds: an archive put into a container makes none itself
            info = tarfile.TarInfo(folder)
            info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
            tar.addfile(info)
        for name, content in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mode = 0o755 if name.endswith((".sh", ".py", ".pyz")) or name == "py-spy" else 0o644
            info.mtime = 0
            tar.addfile(info, io.BytesIO(content))
    buffer.seek(0)
    return buffer


def build_node(
    client: docker.DockerClient, context: dict[str, bytes], tag: str, base: str, progress: Progress,
    force: bool = False, proxies: dict[str, str] | None = None,
) -> BuildResult:
    """Build the node image as `tag` on `base` unless the engine has it already.

    `proxies` (Docker's predefined proxy arguments, see hostsettings.proxy_build_args) reach
    the build's apt-get and are kept in no image.
    """
    if not force and image_exists(client, tag):
        return BuildResult(tag, client.images.get(tag).id, built=False)
    log_path = new_log("node")
    progress.step(f"building the node image {tag} on {base}")
    with log_path.open("w") as log:
        try:
            for chunk in client.api.build(
                fileobj=tar_context(context), custom_context=True, tag=tag, rm=True, forcerm=True,
                decode=True, buildargs={"BASE_IMAGE": base, **(proxies or {})}, labels={"tflab.image": "node"},
            ):
                if "stream" in chunk:
                    text = chunk["stream"]
                    log.write(text)
                    if text.strip():
                        progress.detail(text.strip())
                elif "status" in chunk:
                    log.write(f"{chunk['status']} {chunk.get('progress', '')}\n")
                    progress.detail(f"{chunk['status']} {chunk.get('id', '')}".strip())
                elif "error" in chunk:
                    log.write(chunk["error"] + "\n")
                    raise EngineError(node_build_advice(chunk["error"], str(log_path)))
        except docker.errors.APIError as exc:
            log.write(str(exc) + "\n")
            raise EngineError(node_build_advice(str(exc), str(log_path))) from exc
    return BuildResult(tag, client.images.get(tag).id, built=True, log=log_path)


def node_build_advice(error: str, log_path: str) -> str:
    """One sentence on a failed node build: what failed, what to do, where the log is."""
    first = error.strip().splitlines()[0] if error.strip() else "unknown error"
    if any(s in error for s in ("pull access denied", "not found", "no such host", "dial tcp")):
        return (
            f"the node image's base could not be pulled ({first}); with no registry, "
            f"generate the lab with --base local (tflab builds that base itself); log: {log_path}"
        )
    return f"building the node image failed: {first}; log: {log_path}"


def registry_of(ref: str) -> str | None:
    """The registry an image name names (`localhost:5000/tf:2.18` -> localhost:5000), or None for Docker Hub."""
    first, sep, _rest = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return None


def pull(client: docker.DockerClient, ref: str, progress: Progress) -> None:
    """Pull a base image from its registry, or say what to do instead."""
    repository, tag = parse_repository_tag(ref)
    progress.step(f"pulling {ref}")
    try:
        for chunk in client.api.pull(repository, tag=tag or "latest", stream=True, decode=True):
            if "status" in chunk:
                progress.detail(f"pull {ref}: {chunk['status']} {chunk.get('progress', '')}".strip())
            if "error" in chunk:
                raise docker.errors.APIError(chunk["error"])
    except docker.errors.APIError as exc:
        why = str(exc).splitlines()[0][:160]
        registry = registry_of(ref)
        if registry is not None:
            raise EngineError(f"cannot pull {ref} from the registry {registry} ({why}); is it running and "
                              f"reachable from this engine, and is {repository.split('/', 1)[1]}:{tag or 'latest'} "
                              "pushed there? (`docker pull " + ref + "` shows the engine's own words)") from exc
        raise EngineError(
            f"cannot pull {ref} ({why}); with no registry, generate the lab with --base local "
            "(tflab builds that base itself)"
        ) from exc


def bake_context(node_tag: str, folders: dict[str, tuple[Path, dict[str, list[int]]]]) -> Path:
    """A build context: the node image with folders copied in (`/workspace`: the code, `/data`: the data)."""
    lines = [f"FROM {node_tag}"]
    handle = tempfile.NamedTemporaryFile(prefix="tflab-bake-", suffix=".tar", delete=False)
    with tarfile.open(fileobj=handle, mode="w", dereference=True) as tar:
        for target, (source, files) in folders.items():
            inside = target.strip("/")
            for relative in files:
                tar.add(source / relative, arcname=f"{inside}/{relative}", recursive=False)
            lines.append(f"COPY {inside}/ /{inside}/")
        dockerfile = ("\n".join(lines) + "\n").encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(dockerfile)
        tar.addfile(info, io.BytesIO(dockerfile))
    handle.close()
    return Path(handle.name)


def bake(client: docker.DockerClient, node_tag: str, folders: dict[str, Path], tag: str | None,
         progress: Progress) -> BuildResult:
    """An image for clusters that get no copies: the node image with the lab's code (and data) inside."""
    manifests = {target: (source, manifest(source)) for target, source in folders.items()}
    digest = hashlib.sha256(node_tag.encode())
    for target, (_source, files) in sorted(manifests.items()):
        digest.update(json.dumps([target, files], sort_keys=True).encode())
    tag = tag or f"tflab-baked:{digest.hexdigest()[:16]}"
    if image_exists(client, tag) and client.images.get(tag).labels.get("tflab.baked") == digest.hexdigest():
        return BuildResult(tag, client.images.get(tag).id, built=False)
    progress.step(f"baking {', '.join(folders)} into {tag}")
    context = bake_context(node_tag, manifests)
    log_path = new_log("bake")
    try:
        with context.open("rb") as data, log_path.open("w") as log:
            for chunk in client.api.build(fileobj=data, custom_context=True, tag=tag, rm=True, forcerm=True,
                                          decode=True, labels={"tflab.image": "baked", "tflab.baked": digest.hexdigest()}):
                if "stream" in chunk:
                    log.write(chunk["stream"])
                    progress.detail(chunk["stream"].strip())
                elif "error" in chunk:
                    raise EngineError(f"baking {tag} failed: {chunk['error'].strip()}; log: {log_path}")
    finally:
        context.unlink(missing_ok=True)
    return BuildResult(tag, client.images.get(tag).id, built=True, log=log_path)
