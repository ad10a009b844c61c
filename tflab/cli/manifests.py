"""`tflab render k8s`: the lab as a Kubernetes manifest (a Kubeflow TFJob or a JobSet)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tflab.cli.common import LabOption, err_console, open_lab
from tflab.render import k8s


def k8s_(
    kind: Annotated[str, typer.Option(help="tfjob (Kubeflow's training operator) or jobset (JobSet, no Kubeflow).")] = "tfjob",
    image: Annotated[str | None, typer.Option(help="The image, with the code in /workspace (`tflab build --bake` makes one).")] = None,
    task: Annotated[str | None, typer.Option(help="The task every replica runs (default: train, else the first task).")] = None,
    runs_claim: Annotated[str, typer.Option(help="PersistentVolumeClaim mounted at /runs.")] = "tflab-runs",
    namespace: Annotated[str | None, typer.Option(help="Namespace of the job (default: none, kubectl's).")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the manifest here (default: standard output).")] = None,
    lab: LabOption = Path("."),
) -> None:
    """Write the lab as a Kubernetes manifest, validated (strictly) against the CRD schemas first."""
    lf = open_lab(lab)
    text = k8s.render_manifest(lf.config, lf.lab, kind, image, task, runs_claim, namespace)
    if output is None:
        typer.echo(text, nl=False)
        return
    output.write_text(text)
    err_console().print(f"wrote {output}: a {k8s.KINDS[kind]} of {len(lf.lab.nodes)} nodes, validated")



