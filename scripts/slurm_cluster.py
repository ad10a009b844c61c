#!/usr/bin/env python3
"""A small real Slurm cluster on this machine, in containers, for trying `tflab render slurm` and for its test.

    python scripts/slurm_cluster.py up --image IMAGE --share DIR [--nodes 4] [--cpus 1] [--memory 1500] [--name N]
    python scripts/slurm_cluster.py image --image IMAGE     # only its image, built once per IMAGE
    python scripts/slurm_cluster.py exec [--name N] -- CMD ...      # a command on the controller (sbatch, scontrol)
    python scripts/slurm_cluster.py down [--name N]

Not a tflab command (tflab never grows its own cluster manager). `up` makes, from Debian's own
packages (`slurmctld`, `slurmd`, `munge`: Slurm 22.05) installed on top of IMAGE (a lab's node
image, so the compute nodes have its Python and TensorFlow: the `--container none` form):

- a controller `slurmctl` and NODES compute nodes `c1`..`cN`, each an unprivileged container
  on one network of their own, each compute node declared with the lab's cores and memory;
- DIR at the same path in every container, as a cluster's shared file system: a lab made
  under it is submitted from its own folder (`cd LAB && sbatch job.sh`);
- the settings an unprivileged container can give Slurm: process tracking by /proc
  (proctrack/linuxproc), no task confinement (task/none), no job accounting, one munge key
  baked into the image. Finished jobs stay known to `scontrol show job` for an hour.

`down` removes the containers and the network (the image stays cached, as the local base does).
"""

from __future__ import annotations

import argparse
import hashlib
import subprocess
import sys
import time
from pathlib import Path

LABEL = "tflab.fixture=slurm"
DEFAULT_NAME = "tflab-slurm"
DOCKERFILE = """\
ARG IMAGE
FROM ${IMAGE}
USER root
RUN set -e; export DEBIAN_FRONTEND=noninteractive; apt-get update -qq; \\
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge procps >/dev/null; \\
    rm -rf /var/lib/apt/lists/*; \\
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 2>/dev/null; \\
    chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key; \\
    mkdir -p /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge; chown munge:munge /run/munge
LABEL tflab.fixture=slurm
"""
CONF = """\
ClusterName=tflab
SlurmctldHost=slurmctl
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=3600
KillWait=10
SlurmctldTimeout=30
SlurmdTimeout=60
NodeName=c[1-{nodes}] CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName=lab Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
START = ("printf '%s' \"$SLURM_CONF_TEXT\" > /etc/slurm/slurm.conf; "
         "runuser -u munge -- /usr/sbin/munged; exec {daemon} -D > /var/log/slurm/daemon.log 2>&1")


def say(message: str) -> None:
    print(f"slurm-cluster: {message}", flush=True)


def sh(*argv: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess:
    done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise SystemExit(f"slurm-cluster: `{' '.join(argv)}` failed: {(done.stderr or done.stdout).strip()[-800:]}")
    return done


def image_for(base: str) -> str:
    """IMAGE with Slurm and munge on it, built once per IMAGE."""
    image_id = sh("docker", "image", "inspect", "--format", "{{.Id}}", base).stdout.strip()
    tag = f"tflab-slurm-node:{hashlib.sha256(image_id.encode()).hexdigest()[:12]}"
    if sh("docker", "image", "inspect", tag, check=False).returncode == 0:
        return tag
    say(f"building {tag} (Debian's slurmctld, slurmd and munge on {base})")
    context = Path(sh("mktemp", "-d").stdout.strip())
    (context / "Dockerfile").write_text(DOCKERFILE)
    sh("docker", "build", "-q", "--build-arg", f"IMAGE={base}", "-t", tag, str(context), timeout=1800)
    return tag


def controller(name: str) -> str:
    return f"{name}-slurmctl"


def up(args: argparse.Namespace) -> None:
    share = Path(args.share).resolve()
    if not share.is_dir():
        raise SystemExit(f"slurm-cluster: --share {share} is not a folder")
    if sh("docker", "network", "inspect", args.name, check=False).returncode == 0:
        raise SystemExit(f"slurm-cluster: {args.name} is up already; `down --name {args.name}` first")
    image = image_for(args.image)
    conf = CONF.format(nodes=args.nodes, cpus=args.cpus, memory=args.memory)
    made: list[str] = []
    try:
        sh("docker", "network", "create", "--label", LABEL, args.name)
        made.append("network")
        members = [("slurmctl", "slurmctld")] + [(f"c{i}", "slurmd") for i in range(1, args.nodes + 1)]
        for host, daemon in members:
            sh("docker", "run", "-d", "--name", f"{args.name}-{host}", "--hostname", host, "--label", LABEL,
               "--label", f"tflab.fixture.cluster={args.name}", "--network", args.name, "--network-alias", host,
               "--init", "-v", f"{share}:{share}", "-e", f"SLURM_CONF_TEXT={conf}",
               *(["--cpus", str(args.cpus), "--memory", f"{args.memory + 512}m"] if daemon == "slurmd" else []),
               "--entrypoint", "sh", image, "-c", START.format(daemon=daemon))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            state = exec_(args.name, "sinfo", "-h", "-o", "%T %D", check=False).stdout.split()
            if state[:1] == ["idle"] and int(state[1]) == args.nodes:
                say(f"up: {args.name}: controller slurmctl, compute nodes c1..c{args.nodes} ({args.cpus} CPU, "
                    f"{args.memory} MB each), {share} shared")
                return
            time.sleep(1)
        logs = sh("docker", "logs", f"{args.name}-c1", check=False)
        raise SystemExit(f"slurm-cluster: the nodes were not idle within 120s: sinfo says {' '.join(state)!r}; "
                         f"c1: {(logs.stdout + logs.stderr).strip()[-400:]}")
    except BaseException:
        down(args)
        raise


def exec_(name: str, *argv: str, check: bool = True, cwd: str | None = None, timeout: float = 900) \
        -> subprocess.CompletedProcess:
    return sh("docker", "exec", *(["-w", cwd] if cwd else []), controller(name), *argv, check=check, timeout=timeout)


def down(args: argparse.Namespace) -> None:
    ids = sh("docker", "ps", "-aq", "--filter", f"label=tflab.fixture.cluster={args.name}", check=False).stdout.split()
    if ids:
        sh("docker", "rm", "-f", *ids, check=False)
    sh("docker", "network", "rm", args.name, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    start = commands.add_parser("up")
    start.add_argument("--image", required=True, help="a lab's node image (tflab build makes it)")
    start.add_argument("--share", required=True, help="the cluster's shared folder (a lab made under it)")
    start.add_argument("--nodes", type=int, default=4)
    start.add_argument("--cpus", type=int, default=1)
    start.add_argument("--memory", type=int, default=1500, help="MB per compute node")
    start.add_argument("--name", default=DEFAULT_NAME)
    run = commands.add_parser("exec")
    run.add_argument("--name", default=DEFAULT_NAME)
    run.add_argument("--cwd")
    run.add_argument("argv", nargs=argparse.REMAINDER)
    stop = commands.add_parser("down")
    stop.add_argument("--name", default=DEFAULT_NAME)
    build = commands.add_parser("image", help="only build (or find) the compute nodes' image of IMAGE; print its tag")
    build.add_argument("--image", required=True, help="a lab's node image (tflab build makes it)")
    args = parser.parse_args()
    if args.command == "up":
        up(args)
    elif args.command == "image":
        print(image_for(args.image))
    elif args.command == "exec":
        argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        done = exec_(args.name, *argv, check=False, cwd=args.cwd)
        sys.stdout.write(done.stdout)
        sys.stderr.write(done.stderr)
        sys.exit(done.returncode)
    else:
        down(args)


if __name__ == "__main__":
    main()
