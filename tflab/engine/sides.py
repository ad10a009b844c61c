"""Picks a lab's engine side: compose on this host, or a stack on an existing swarm (tflab.yaml's `target`)."""

from __future__ import annotations

import docker

from tflab.engine.backend import LabBackend
from tflab.host.labfiles import LabFiles


def open_backend(lf: LabFiles, client: docker.DockerClient) -> LabBackend:
    """The engine side of a lab, as a `LabBackend`.

    Each kind is imported only when a lab of that kind is opened (the swarm's pulls in its
    stack schema's validator); nothing below imports this module, so there is no circle.
    """
    side: LabBackend
    if lf.config.target == "swarm":
        from tflab.engine.swarm_lab import SwarmLab

        side = SwarmLab(lf, client)
    else:
        from tflab.engine.compose_lab import ComposeLab

        side = ComposeLab(lf, client)
    return side
