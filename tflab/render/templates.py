"""Every generated file comes from a Jinja2 template under templates/ (tflab's package data)."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from tflab import resources
from tflab.plan import config as cfg
from tflab.plan import links, proxies, shares
from tflab.plan.config import COMPOSE_FILE, LabConfig
from tflab.plan.topology import Lab


@lru_cache(maxsize=1)
def jinja_env():  # -> jinja2.Environment (imported here: most commands render nothing)
    """The one Jinja2 environment: strict about missing values, trailing newlines kept."""
    import jinja2

    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(resources.path(resources.TEMPLATES))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render(template: str, **values: Any) -> str:
    """Render templates/`template` with `values`."""
    return jinja_env().get_template(template).render(**values)


def project_name(name: str, lab_dir: Path) -> str:
    """A compose project name unique to the lab: its name and a hash of its folder."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "lab"
    digest = hashlib.sha256(str(lab_dir.resolve()).encode()).hexdigest()[:8]
    return f"tflab-{slug[:30]}-{digest}"


@dataclass(frozen=True)
class Volume:
    """A bind mount of the compose file."""

    source: str
    target: str
    read_only: bool


def volumes(config: LabConfig) -> list[Volume]:
    """Keys read-only, the shared runs folder, and the data when it is mounted, not copied."""
    mounts = [
        Volume("./keys", "/etc/tflab/keys", True),
        Volume(_relative(config.runs), "/runs", False),
    ]
    if config.data and config.data_mode == "mount":
        mounts.append(Volume(_relative(config.data), "/data", True))
    return mounts


def _relative(path: str) -> str:
    """Compose resolves `./x` against the compose file's folder, which is the lab."""
    return path if path.startswith(("/", "./", "../")) else f"./{path}"


def node_values(lab: Lab) -> list[dict[str, Any]]:
    """What the templates need of each node."""
    return [
        {
            "name": n.name,
            "job": n.job,
            "env": n.env,
            "ssh_port": n.ssh_port,
            "tensorboard_port": n.tensorboard_port,
            "gpus": n.gpus,
            "gpu_ids": [str(g) for g in n.gpus],
            "gpu_list": ",".join(str(g) for g in n.gpus),
            "cpuset": shares.cpu_list(n.share.cpuset) if n.share.cpuset else None,
            "cpu_quota": n.share.quota,
            # A swarm service's limit: the CPUs it owns (the stack format has no cpuset).
            "cpus_limit": f"{n.share.cpus:g}" if n.share.cpus is not None else None,
            "memory": f"{n.share.memory_mib}m" if n.share.memory_mib is not None else None,
        }
        for n in lab.nodes
    ]


def lab_env(lab: Lab, config: LabConfig, node_proxies: Mapping[str, str] | None = None) -> dict[str, str]:
    """What every node sees beyond its own plan: its links' shaping, Keras 2's switch, and, where the nodes carry
    proxy variables (`node_proxies`: what the Docker client puts into each container), NO_PROXY naming the lab."""
    return {**links.environment(config.links), **cfg.keras_env(config.keras),
            **proxies.no_proxy_env(node_proxies or {}, lab.names)}


def compose_file(lab: Lab, config: LabConfig, lab_dir: Path, image: str, project: str | None = None,
                 node_proxies: Mapping[str, str] | None = None) -> str:
    """The compose file's text for `lab` (its project: the lab's own, else the one of its folder)."""
    return render(
        "docker-compose.yml.j2",
        project=project or project_name(config.name, lab_dir),
        nodes=node_values(lab),
        image=image,
        shm_size=config.shm_size,
        memlock=config.memlock,
        bind=lab.topology.bind,
        volumes=volumes(config),
        lab_env=lab_env(lab, config, node_proxies),
        net_admin=config.net_admin,
        compose_file=COMPOSE_FILE,
    )


size_bytes = shares.size_bytes


def stack_file(lab: Lab, config: LabConfig, lab_dir: Path, image: str, secret_names: tuple[str, str],
               project: str | None = None, node_proxies: Mapping[str, str] | None = None) -> str:
    """The swarm stack file's text for `lab` (absolute paths: swarm does not read them relative)."""
    cfg.check_swarm_bind(lab.topology.bind)
    nodes = node_values(lab)
    for node in nodes:
        node["place"] = config.swarm.place.get(node["name"])
    mounts = [Volume(str((lab_dir / config.runs).resolve()), "/runs", False)]
    if config.data and config.data_mode == "mount":
        mounts.append(Volume(str((lab_dir / config.data).resolve()), "/data", True))
    return render(
        "docker-stack.yml.j2",
        stack=project or project_name(config.name, lab_dir),
        stack_file=cfg.STACK_FILE,
        nodes=nodes,
        image=image,
        memlock=config.memlock,
        lab_env=lab_env(lab, config, node_proxies),
        net_admin=config.net_admin,
        volumes=mounts,
        shm_bytes=size_bytes(config.shm_size),
        key_secret=secret_names[0],
        pub_secret=secret_names[1],
        private_key=str(lab_dir / cfg.KEYS_DIR / cfg.PRIVATE_KEY),
        public_key=str(lab_dir / cfg.KEYS_DIR / cfg.PUBLIC_KEY),
    )


