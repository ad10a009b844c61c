"""`tflab doctor`: what this host has and lacks for a lab, each with the command that fixes it."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

import docker

from tflab.engine import daemon
from tflab.engine.containers import probe_qdiscs
from tflab.errors import TflabError, UserError
from tflab.host import hardware, ports, proc
from tflab.plan.topology import SSH_PORT_BASE, TENSORBOARD_PORT_BASE


@dataclass(frozen=True)
class Check:
    """One line of the report: ok, a warning (optional), or a failure (needed)."""

    name: str
    status: str  # ok | warn | fail
    detail: str
    fix: str = ""


def _engine() -> tuple[Check, docker.DockerClient | None]:
    try:
        client = daemon.client()
    except TflabError as exc:
        fix = "sudo dockerd &  (or: systemctl start docker)" if shutil.which("dockerd") else \
            "apt-get install docker.io && dockerd &"
        return Check("Docker Engine", "fail", str(exc), fix), None
    version = client.version().get("Version", "?")
    return Check("Docker Engine", "ok", f"engine {version} answers"), client


def _compose() -> Check:
    try:
        argv = daemon.find_compose()
    except TflabError:
        return Check("Compose v2", "warn", "none: not needed by tflab, only to run a lab's compose file by hand",
                     "pip install 'tflab[compose]'  (or apt-get install docker-compose-plugin)")
    return Check("Compose v2", "ok", " ".join(argv))


def _gpus() -> Check:
    found = hardware.discover(proc.run)
    if not found:
        return Check("GPUs", "warn", "no GPU (no working nvidia-smi): CPU labs only",
                     "install the NVIDIA driver for GPU labs")
    return Check("GPUs", "ok", f"{len(found)} x {found[0].name or 'GPU'}")


def _runtime(client: docker.DockerClient | None, has_gpus: bool) -> Check:
    if client is None:
        return Check("NVIDIA runtime", "warn", "engine not reachable")
    runtimes = client.info().get("Runtimes", {})
    if "nvidia" in runtimes:
        return Check("NVIDIA runtime", "ok", "nvidia runtime registered")
    return Check("NVIDIA runtime", "warn" if not has_gpus else "fail",
                 "no nvidia runtime in the engine" + ("" if has_gpus else " (not needed for CPU labs)"),
                 "install nvidia-container-toolkit && nvidia-ctk runtime configure --runtime=docker")


def _disk(client: docker.DockerClient | None) -> Check:
    root = (client.info().get("DockerRootDir") if client else None) or "/var/lib/docker"
    path = root if os.path.exists(root) else "/"
    free_gib = shutil.disk_usage(path).free / 2**30
    if free_gib < 10:
        return Check("Disk", "fail", f"{free_gib:.1f} GiB free under {path}; images need about 10 GiB",
                     "docker system prune  (or free space)")
    return Check("Disk", "ok", f"{free_gib:.0f} GiB free under {path}")


def _ports(bases: tuple[int, int], count: int) -> Check:
    taken = [p for base in bases for p in range(base, base + count) if not ports.port_free("127.0.0.1", p)]
    if taken:
        return Check("Ports", "warn", f"taken on 127.0.0.1: {', '.join(map(str, taken[:6]))}",
                     "tflab gen --ssh-port-base N --tensorboard-port-base M")
    return Check("Ports", "ok", f"{bases[0]}+ and {bases[1]}+ free for {count} nodes")


def _links(client: docker.DockerClient | None) -> Check:
    """Which qdiscs --link-rate (tbf) and --link-delay (netem) can use, tried in a throwaway container."""
    if client is None:
        return Check("Link shaping", "warn", "engine not reachable")
    images = [t for i in client.images.list() for t in i.tags if t.startswith(("tflab-node:", "tflab-base:"))]
    if not images:
        return Check("Link shaping", "warn", "not probed yet: no tflab image to probe with", "tflab base (or tflab up)")
    try:
        found = probe_qdiscs(client, sorted(images)[0])
    except TflabError as exc:
        return Check("Link shaping", "warn", str(exc))
    offered = [q for q, why in found.items() if why is None]
    missing = {q: why for q, why in found.items() if why is not None}
    detail = f"kernel qdiscs: {', '.join(offered) or 'none'}"
    if not missing:
        return Check("Link shaping", "ok", detail + " (--link-rate and --link-delay work)")
    gaps = "; ".join(f"{q} missing ({why})" for q, why in missing.items())
    needs = [flag for flag, q in (("--link-rate", "tbf"), ("--link-delay", "netem")) if q in missing]
    return Check("Link shaping", "warn", f"{detail}; {gaps}: {' and '.join(needs) or 'nothing'} unavailable",
                 " ".join(f"modprobe sch_{q}" for q in missing))


def _bootstrap_tool() -> Check:
    from tflab.engine.local_base import bootstrap_tool

    why = "builds the local base where no registry is reachable"
    try:
        return Check(bootstrap_tool(), "ok", why)
    except UserError:
        return Check("mmdebstrap", "warn", f"missing (and no debootstrap): {why}", "apt-get install mmdebstrap")


def _tool(name: str, why: str, package: str) -> Check:
    if shutil.which(name):
        return Check(name, "ok", why)
    return Check(name, "warn", f"missing: {why}", f"apt-get install {package}")


SLURM_RUNTIMES = (("apptainer", "apptainer"), ("singularity", "apptainer"), ("enroot", "pyxis"))


def _slurm() -> Check:
    """Whether this host submits to a Slurm cluster (`tflab render slurm`), and which container form it can run."""
    sbatch = shutil.which("sbatch")
    if not sbatch:
        return Check("Slurm", "ok", "no sbatch here: `tflab render slurm` writes a job to submit where it is "
                                    "(not needed for labs)")
    runtimes = [f"{tool} (--container {form})" for tool, form in SLURM_RUNTIMES if shutil.which(tool)]
    try:
        done = subprocess.run([sbatch, "--version"], capture_output=True, text=True, timeout=10)
        version = done.stdout.strip() or done.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Check("Slurm", "warn", f"{sbatch} does not answer: {exc}")
    return Check("Slurm", "ok", f"{version} reachable; container runtime: "
                                f"{', '.join(runtimes) or 'none found here (--container none: the nodes own Python)'}")


def run_checks() -> list[Check]:
    """Every check, in the order a user fixes things."""
    engine_check, client = _engine()
    gpu_check = _gpus()
    return [
        engine_check,
        _compose(),
        gpu_check,
        _runtime(client, gpu_check.status == "ok"),
        _disk(client),
        _ports((SSH_PORT_BASE, TENSORBOARD_PORT_BASE), 4),
        _links(client),
        _bootstrap_tool(),
        _tool("ssh", "`tflab ssh`", "openssh-client"),
        _slurm(),
    ]
