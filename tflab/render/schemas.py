"""Files for other engines, checked offline before they are written.

The JSON schemas tflab ships (schemas/, copied from docker/cli, Kubeflow and JobSet; see
schemas/README.md) are applied strictly: the CRD schemas leave objects open, so a misspelled
field would pass them; here every object that lists its properties is closed, unless it
says it keeps unknown fields. Rules the engines enforce beyond the schemas are added:
the keys `docker stack deploy` silently ignores, and the Kubeflow webhook's checks.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from tflab import resources

STACK_SCHEMA = "docker-stack-v3.13.json"
TFJOB_SCHEMA = "tfjob-kubeflow.org-v1.schema.json"
JOBSET_SCHEMA = "jobset-jobset.x-k8s.io-v1alpha2.schema.json"

# Keys of the compose format that `docker stack deploy` accepts and then ignores.
IGNORED_BY_STACK = {
    "build": "swarm never builds: `tflab build` makes the image (with --registry it is pushed)",
    "devices": "swarm passes no devices: GPUs go by NVIDIA_VISIBLE_DEVICES with the NVIDIA runtime as the default",
    "shm_size": "swarm sets no shared memory size: mount a tmpfs volume at /dev/shm",
    "restart": "swarm restarts by deploy.restart_policy",
    "depends_on": "swarm starts services in no order: tflab's run orders them",
    "container_name": "swarm names containers itself",
}


@lru_cache(maxsize=None)
def schema(name: str) -> dict[str, Any]:
    """One of the schemas tflab ships."""
    return json.loads((resources.path(resources.SCHEMAS) / name).read_text())


def closed(node: Any) -> Any:
    """A copy of a schema in which every object listing `properties` rejects any other key."""
    if isinstance(node, list):
        return [closed(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: closed(value) for key, value in node.items()}
    if ("properties" in node and "additionalProperties" not in node and "patternProperties" not in node
            and not node.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@lru_cache(maxsize=None)
def _validator(name: str, strict: bool):
    import jsonschema

    document = closed(schema(name)) if strict else copy.deepcopy(schema(name))
    cls = jsonschema.validators.validator_for(document)
    return cls(document)


def _path(parts: Iterable[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def schema_problems(document: Any, name: str, strict: bool = True) -> list[str]:
    """Every way `document` breaks schema `name`, as `path: what` sentences."""
    problems = []
    for error in sorted(_validator(name, strict).iter_errors(document), key=lambda e: list(map(str, e.path))):
        while error.validator in ("oneOf", "anyOf") and error.context:
            # The branch of the value's own type says what is wrong with it.
            fitting = [e for e in error.context if e.validator != "type"] or list(error.context)
            error = fitting[0]
        where = _path(error.absolute_path)
        if error.validator == "additionalProperties":
            unexpected = re.findall(r"'([^']+)'", error.message.split("(")[-1]) or [error.message]
            for key in unexpected:
                problems.append(f"{where}: {key!r} is not a field here")
        else:
            problems.append(f"{where}: {error.message}")
    return problems


def stack_problems(document: Any) -> list[str]:
    """A stack file's problems: the v3.13 schema, and the keys `docker stack deploy` ignores."""
    problems = schema_problems(document, STACK_SCHEMA, strict=False)
    services = document.get("services") if isinstance(document, dict) else None
    for name, service in (services or {}).items():
        if not isinstance(service, dict):
            continue
        for key, why in IGNORED_BY_STACK.items():
            if key in service:
                problems.append(f"services.{name}.{key} is ignored by `docker stack deploy`: {why}")
        devices = (((service.get("deploy") or {}).get("resources") or {}).get("reservations") or {}).get("devices")
        if devices is not None:
            problems.append(f"services.{name}.deploy.resources.reservations.devices is refused by "
                            f"`docker stack deploy`: {IGNORED_BY_STACK['devices']}")
    return problems
