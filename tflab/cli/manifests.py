"""`tflab render k8s` and `tflab render slurm`: the lab as a Kubernetes manifest (a Kubeflow TFJob or a JobSet)
or as a Slurm batch script."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer

from tflab.cli.common import LabOption, err_console, open_lab
from tflab.errors import UserError
from tflab.host import dockerconfig
from tflab.plan import proxies
from tflab.render import k8s, slurm


def k8s_(
    kind: Annotated[str, typer.Option(help="tfjob (Kubeflow's training operator) or jobset (JobSet, no Kubeflow).")] = "tfjob",
    image: Annotated[str | None, typer.Option(help="The image, with the code in /workspace (`tflab build --bake` makes one).")] = None,
    task: Annotated[str | None, typer.Option(help="The task every replica runs (default: train, else the first task).")] = None,
    runs_claim: Annotated[str, typer.Option(help="PersistentVolumeClaim mounted at /runs.")] = "tflab-runs",
    namespace: Annotated[str | None, typer.Option(help="Namespace of the job (default: none, kubectl's).")] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the manifest here (default: standard output).")] = None,
    cpus_per_node: Annotated[str | None, typer.Option("--cpus-per-node", help="CPUs each pod asks for on the cluster (8, or 0.5; 0: none asked), in place of the node's share of this host.")] = None,
    memory_per_node: Annotated[str | None, typer.Option("--memory-per-node", help="Memory each pod asks for on the cluster (32g; 0: none asked), in place of the node's share of this host.")] = None,
    lab: LabOption = Path("."),
) -> None:
    """Write the lab as a Kubernetes manifest, validated (strictly) against the CRD schemas first."""
    lf = open_lab(lab)
    pods = k8s.sized(lf.lab, cpus_per_node, memory_per_node)
    text = k8s.render_manifest(lf.config, pods, kind, image, task, runs_claim, namespace, node_proxies())
    if output is None:
        typer.echo(text, nl=False)
        return
    output.write_text(text)
    err_console().print(f"wrote {output}: a {k8s.KINDS[kind]} of {len(lf.lab.nodes)} nodes, validated")





def node_proxies() -> dict[str, str]:
    """The proxy variables a cluster's pods would carry, as far as this host can tell: its own environment's and
    those the Docker client puts into containers."""
    return {**{name: os.environ[name] for name in proxies.PROXY_VARS + proxies.NO_PROXY_VARS if os.environ.get(name)},
            **dockerconfig.container_proxies()}


def slurm_(
    task: Annotated[str | None, typer.Option(help="The task the job runs (default: train, else the first task).")] = None,
    container: Annotated[str, typer.Option(help="none (the compute nodes' own Python), apptainer or pyxis.")] = "none",
    partition: Annotated[str | None, typer.Option(help="The partition (sbatch --partition).")] = None,
    time: Annotated[str | None, typer.Option("--time", help="The job's time limit, as Slurm writes it (30, 1:00:00, 1-12).")] = None,
    account: Annotated[str | None, typer.Option(help="The account charged (sbatch --account).")] = None,
    runs: Annotated[str, typer.Option(help="Where each job writes its outputs (a folder per job), relative to the lab folder.")] = "runs",
    image: Annotated[str | None, typer.Option(help="The node image for apptainer (a .sif) or pyxis (an enroot image reference).")] = None,
    grace: Annotated[float, typer.Option(help="Seconds a worker may run after the chief finished before it is reported hung.")] = 30.0,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the script here (default: standard output).")] = None,
    lab: LabOption = Path("."),
) -> None:
    """Write the lab as a Slurm batch script: one Slurm node per lab node, servers first, the workers' exit code."""
    lf = open_lab(lab)
    if not 0 <= grace < 86400:
        raise UserError(f"--grace {grace:g} must be between 0 and 86400 seconds")
    text = slurm.render(lf.config, lf.lab, k8s.pick_task(lf.config, task), container, partition, time, account, runs,
                        image, grace)
    if output is None:
        typer.echo(text, nl=False)
        return
    output.write_text(text)
    output.chmod(0o755)
    err_console().print(f"wrote {output}: a Slurm job of {len(lf.lab.nodes)} nodes; `sbatch {output.name}` from the "
                        "lab folder on the cluster's shared file system submits it")
