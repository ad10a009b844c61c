"""A lab's compose file started through the docker SDK, every node at once.

tflab writes the compose file (templates/docker-compose.yml.j2) and it stays the single
description of the nodes: plain `docker compose` runs it as well (the tests check both give
the same containers). `up` reads that file and starts what it says through the engine API
itself, all nodes in parallel, handing each node on as soon as it runs (to be copied into
and waited on while the others start): the compose CLI would cost a second more at four
nodes, and nothing could overlap it. Only the keys tflab's template writes are understood;
a file edited to use others is refused with a sentence, never half-started.

The containers, their names and their network carry compose's own labels, so
`docker compose -f docker-compose.yml ps|logs|down` knows them too.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import docker
import docker.errors
import docker.types
from docker.models.containers import Container

from tflab.engine.containers import labelled
from tflab.errors import EngineError, UserError
from tflab.host.fanout import parallel
from tflab.plan.proxies import NO_PROXY_VARS

SERVICE_KEYS = {"image", "hostname", "working_dir", "init", "restart", "shm_size", "cpuset", "cpus", "mem_limit",
                "memswap_limit", "ulimits", "cap_add", "labels",
                "environment", "ports", "volumes", "networks", "deploy", "healthcheck"}
TOP_KEYS = {"name", "services", "networks"}
CPU_PERIOD = 100_000  # microseconds: the kernel's default CFS period


@dataclass(frozen=True)
class Service:
    """One node as the engine creates it."""

    name: str
    container_name: str
    create: dict[str, Any] = field(hash=False)
    network: str = ""
    aliases: tuple[str, ...] = ()
    spec: str = ""  # a hash of the service's entry: a changed entry means a new container


def _refuse(where: str, what: str) -> UserError:
    return UserError(f"the compose file's {where} uses {what}, which `tflab up` does not start itself; "
                     "run `tflab gen --force` to write it again (or start it with `docker compose up -d`)")


def services(doc: dict[str, Any], lab_dir: Path, project: str, compose_file: Path) -> list[Service]:
    """The services of a compose file tflab wrote, as docker SDK arguments."""
    for key in doc:
        if key not in TOP_KEYS:
            raise _refuse("top level", f"`{key}`")
    out = []
    for name, entry in (doc.get("services") or {}).items():
        for key in entry:
            if key not in SERVICE_KEYS:
                raise _refuse(f"service {name}", f"`{key}`")
        networks = entry.get("networks") or {}
        if len(networks) != 1:
            raise _refuse(f"service {name}", "other than one network")
        network_key, network = next(iter(networks.items()))
        labels = {str(k): str(v) for k, v in (entry.get("labels") or {}).items()}
        spec = hashlib.sha256(json.dumps(entry, sort_keys=True).encode()).hexdigest()[:16]
        labels.update({
            "com.docker.compose.project": project,
            "com.docker.compose.service": name,
            "com.docker.compose.container-number": "1",
            "com.docker.compose.oneoff": "False",
            "com.docker.compose.version": "2",
            # compose lists only containers with a config hash (its own differs: `docker compose up` remakes them)
            "com.docker.compose.config-hash": spec,
            "com.docker.compose.project.working_dir": str(lab_dir),
            "com.docker.compose.project.config_files": str(compose_file),
            "tflab.spec": spec,
        })
        create: dict[str, Any] = {
            "image": entry["image"],
            "name": f"{project}-{name}-1",
            "hostname": entry.get("hostname", name),
            "working_dir": entry.get("working_dir"),
            "init": bool(entry.get("init", False)),
            "restart_policy": {"Name": entry.get("restart", "no")},
            "shm_size": entry.get("shm_size"),
            "cpuset_cpus": str(entry["cpuset"]) if entry.get("cpuset") is not None else None,
            # A quota as period and quota (what compose's `cpus` means), so that a drill may change it.
            "cpu_period": CPU_PERIOD if entry.get("cpus") is not None else None,
            "cpu_quota": int(float(entry["cpus"]) * CPU_PERIOD) if entry.get("cpus") is not None else None,
            "mem_limit": entry.get("mem_limit"),
            "memswap_limit": entry.get("memswap_limit"),
            "cap_add": list(entry.get("cap_add") or []) or None,
            "labels": labels,
            "environment": {str(k): str(v) for k, v in (entry.get("environment") or {}).items()},
            "ports": _ports(name, entry.get("ports") or []),
            "mounts": _mounts(name, entry.get("volumes") or [], lab_dir),
            "ulimits": [docker.types.Ulimit(name=k, soft=int(v), hard=int(v))
                        for k, v in (entry.get("ulimits") or {}).items()] or None,
            "device_requests": _gpus(name, entry.get("deploy")),
            "healthcheck": _healthcheck(name, entry.get("healthcheck")),
            "detach": True,
        }
        # As compose does: the service's and the container's names resolve too.
        aliases = dict.fromkeys([name, *((network or {}).get("aliases") or ()), create["name"]])
        out.append(Service(name, create["name"], {k: v for k, v in create.items() if v is not None},
                           f"{project}_{network_key}", tuple(aliases), spec))
    return out


def _ports(service: str, ports: list[Any]) -> dict[str, tuple[str, int]]:
    out = {}
    for port in ports:
        if not isinstance(port, dict) or set(port) - {"target", "published", "host_ip", "protocol"}:
            raise _refuse(f"service {service}", f"the port {port!r}")
        out[f"{port['target']}/{port.get('protocol', 'tcp')}"] = (port.get("host_ip", ""), int(port["published"]))
    return out


def _mounts(service: str, volumes: list[Any], lab_dir: Path) -> list[docker.types.Mount]:
    out = []
    for volume in volumes:
        if not isinstance(volume, dict) or volume.get("type") != "bind":
            raise _refuse(f"service {service}", f"the volume {volume!r} (tflab writes bind mounts)")
        source = Path(volume["source"])
        source = source if source.is_absolute() else (lab_dir / source).resolve()
        out.append(docker.types.Mount(volume["target"], str(source), type="bind",
                                      read_only=bool(volume.get("read_only", False))))
    return out


def _duration_ns(text: str) -> int:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", str(text).strip())
    if not match:
        raise UserError(f"the compose file's duration {text!r} is not one tflab reads (write 3s, 500ms, 1m)")
    return int(float(match.group(1)) * {"ms": 1e6, "s": 1e9, "m": 60e9, "h": 3600e9}[match.group(2)])


def _healthcheck(service: str, check: dict[str, Any] | None) -> dict[str, Any] | None:
    if not check:
        return None
    if set(check) - {"test", "interval", "timeout", "start_period", "retries"}:
        raise _refuse(f"service {service}", f"the healthcheck {check!r}")
    out: dict[str, Any] = {"test": list(check["test"])}
    for key, field_name in (("interval", "interval"), ("timeout", "timeout"), ("start_period", "start_period")):
        if key in check:
            out[field_name] = _duration_ns(check[key])
    if "retries" in check:
        out["retries"] = int(check["retries"])
    return out


def _gpus(service: str, deploy: dict[str, Any] | None) -> list[docker.types.DeviceRequest] | None:
    if not deploy:
        return None
    devices = (((deploy.get("resources") or {}).get("reservations") or {}).get("devices")) or []
    requests = []
    for device in devices:
        requests.append(docker.types.DeviceRequest(
            driver=device.get("driver", "nvidia"), device_ids=[str(d) for d in device.get("device_ids", [])],
            capabilities=[list(device.get("capabilities", ["gpu"]))]))
    return requests or None


def ensure_network(client: docker.DockerClient, name: str, key: str, project: str, labels: dict[str, str]) -> None:
    """The lab's bridge network, made when missing."""
    if client.networks.list(names=[name]):
        return
    try:
        client.networks.create(name, driver="bridge", labels={
            **labels, "com.docker.compose.project": project, "com.docker.compose.network": key})
    except docker.errors.APIError as exc:
        if "already exists" not in str(exc.explanation or exc):
            raise EngineError(f"cannot make the lab's network {name}: {exc.explanation or exc}") from exc


def pass_by_network(client: docker.DockerClient, service: Service) -> None:
    """A node whose NO_PROXY names the lab's nodes (the compose file's, where it carries proxies) names the lab
    network's addresses too: a program that connects to a peer by its address passes the proxy by as well. The
    network's subnet is the engine's choice, known once the network is made."""
    env = service.create.get("environment") or {}
    named = [name for name in NO_PROXY_VARS if env.get(name)]
    if not named:
        return
    try:
        subnets = [c["Subnet"] for c in client.networks.get(service.network).attrs["IPAM"]["Config"] or []
                   if c.get("Subnet")]
    except (docker.errors.APIError, KeyError, TypeError):
        return
    for name in named:
        env[name] = ",".join(dict.fromkeys([*env[name].split(","), *subnets]))


def start(client: docker.DockerClient, doc: dict[str, Any], lab_dir: Path, project: str, compose_file: Path,
          on_running: Callable[[str, Container], None]) -> dict[str, Container]:
    """Make every node run as the compose file says (all at once); `on_running(node, container)` as each does.

    An unchanged running node is left as it is; a changed one is made again; one no longer in
    the file is removed.
    """
    wanted = services(doc, lab_dir, project, compose_file)
    for key, network in (doc.get("networks") or {}).items():
        ensure_network(client, f"{project}_{key}", key, project, {str(k): str(v) for k, v in
                                                                  ((network or {}).get("labels") or {}).items()})
    for service in wanted:
        pass_by_network(client, service)
    existing = {c.labels.get("com.docker.compose.service"): c for c in
                labelled(client, f"com.docker.compose.project={project}")}
    for name, container in existing.items():
        if name not in {s.name for s in wanted}:
            container.remove(force=True)

    def run(service: Service) -> Container:
        container = existing.get(service.name)
        if container is not None and container.labels.get("tflab.spec") != service.spec:
            container.remove(force=True)
            container = None
        try:
            if container is None:
                networking = {service.network: client.api.create_endpoint_config(aliases=list(service.aliases))}
                container = client.containers.create(network=service.network, networking_config=networking,
                                                      **service.create)
            if container.status != "running":
                container.start()
        except docker.errors.APIError as exc:
            raise EngineError(start_advice(service.name, str(exc.explanation or exc))) from exc
        on_running(service.name, container)
        return container

    return dict(zip([s.name for s in wanted], parallel(run, wanted, name="start")))


def start_advice(node: str, error: str) -> str:
    """One sentence for a node the engine would not start."""
    if "port is already allocated" in error or "address already in use" in error:
        return (f"{node} cannot start: a port it publishes is already taken on the host ({error}); stop what "
                "holds it or generate the lab with another --ssh-port-base/--tensorboard-port-base")
    if "could not select device driver" in error:
        return (f"{node} reserves GPUs but this engine has no NVIDIA runtime; install the NVIDIA Container "
                "Toolkit, or generate a CPU lab with --gpus-per-node 0")
    if "No such image" in error:
        return f"{node} cannot start: its image is missing; run `tflab build` first"
    return f"{node} cannot start: {error}"
