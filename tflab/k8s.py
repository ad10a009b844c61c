"""A lab as a Kubernetes manifest: a Kubeflow TFJob, or a JobSet for clusters without Kubeflow.

Pure: the lab in, a manifest (a dict) out, validated strictly against the CRD schemas tflab
ships and the rules the Kubeflow admission webhook enforces, before anything is written.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

import yaml

from tflab import config as cfg
from tflab import render, tasks, validate
from tflab.errors import UserError
from tflab.labfiles import LabFiles
from tflab.model import GRPC_PORT, Lab, node_name

KINDS = {"tfjob": "Kubeflow TFJob (kubeflow.org/v1)", "jobset": "JobSet (jobset.x-k8s.io/v1alpha2)"}
TFJOB_TYPES = {"ps": "PS", "worker": "Worker", "chief": "Chief", "evaluator": "Evaluator"}
CLEAN_POD_POLICIES = ("All", "Running", "None")
RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# The placeholders that differ between the replicas of one TFJob type come from the
# TF_CONFIG the operator injects, read by this preamble (the task runs unchanged after it).
FROM_TF_CONFIG = (
    "eval \"$(python3 -c 'import json, os; c = json.loads(os.environ[\"TF_CONFIG\"]); t = c[\"task\"]; "
    "print(\"export TFLAB_JOB_NAME=%s TFLAB_TASK_INDEX=%d TFLAB_PS_HOSTS=%s TFLAB_WORKER_HOSTS=%s TFLAB_NODE=%s%s\" % "
    "(t[\"type\"], t[\"index\"], \",\".join(c[\"cluster\"].get(\"ps\", [])), \",\".join(c[\"cluster\"].get(\"worker\", [])), "
    "t[\"type\"], \"\" if t[\"type\"] in (\"chief\", \"evaluator\") else t[\"index\"]))')\""
)
RUNTIME_VALUES = {
    "node": "${TFLAB_NODE}", "job_name": "${TFLAB_JOB_NAME}", "task_index": "${TFLAB_TASK_INDEX}",
    "ps_hosts": "${TFLAB_PS_HOSTS}", "worker_hosts": "${TFLAB_WORKER_HOSTS}",
}


def job_name(lab_name: str, limit: int) -> str:
    """A DNS-1035 label from the lab's name (Kubernetes names jobs, services and pods after it)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", lab_name.lower()).strip("-")
    slug = f"tflab-{slug}" if not slug or not slug[0].isalpha() else slug
    return slug[:limit].rstrip("-")


def pick_task(lf: LabFiles, name: str | None) -> cfg.Task:
    """The task the manifest runs: the one named, else `train`, else the lab's first."""
    if name is not None:
        return lf.config.task(name)
    if "train" in lf.config.tasks:
        return lf.config.tasks["train"]
    if not lf.config.tasks:
        raise UserError("the lab has no task to run; add one to tflab.yaml (tasks:) or pass --task")
    return next(iter(lf.config.tasks.values()))


def _container(image: str, shell: str, env: dict[str, str], gpus: int) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "tensorflow",
        "image": image,
        "workingDir": "/workspace",
        "command": ["sh", "-c"],
        "args": [shell],
        "env": [{"name": k, "value": v} for k, v in env.items()],
        "ports": [{"name": "tfjob-port", "containerPort": GRPC_PORT}],
        "volumeMounts": [{"name": "runs", "mountPath": "/runs"}, {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return container


def _pod_spec(container: dict[str, Any], runs_claim: str, shm_size: str, restart: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [container],
        "volumes": [
            {"name": "runs", "persistentVolumeClaim": {"claimName": runs_claim}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": _quantity(shm_size)}},
        ],
    }
    if restart:
        spec["restartPolicy"] = restart
    return spec


def _quantity(size: str) -> str:
    return f"{render.size_bytes(size) // 2**20}Mi"


def _env(lab: Lab, task: cfg.Task, node: str) -> dict[str, str]:
    base = {k: v for k, v in lab.node(node).env.items() if k in ("PYTHONUNBUFFERED", "TF_CPP_MIN_LOG_LEVEL",
                                                                "TFLAB_NUM_GPUS", "TFLAB_GPU_MEMORY_MB",
                                                                "TFLAB_GPU_MEMORY_FRACTION")}
    return {**base, **tasks.task_env(task.name)}


def _metadata(name: str, lf: LabFiles, namespace: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"tflab.lab": job_name(lf.config.name, 63)}}
    if namespace:
        meta["namespace"] = namespace
    return meta


def tfjob(lf: LabFiles, image: str, task: cfg.Task, runs_claim: str, namespace: str | None = None) -> dict[str, Any]:
    """A Kubeflow TFJob: one replica spec per role; the operator writes each pod's TF_CONFIG."""
    lab = lf.lab
    name = job_name(lf.config.name, 63)
    specs: dict[str, Any] = {}
    for job, kind in TFJOB_TYPES.items():
        members = [n for n in lab.nodes if n.job == job]
        if not members:
            continue
        values = {**RUNTIME_VALUES, "num_gpus": str(len(members[0].gpus)), "run_dir": tasks.run_dir(task.name)}
        line = f"{FROM_TF_CONFIG} && exec {cfg.fill_placeholders(task.command, values)}"
        container = _container(image, line, _env(lab, task, members[0].name), len(members[0].gpus))
        specs[kind] = {
            "replicas": len(members),
            "restartPolicy": "OnFailure" if job != "ps" else "Never",
            "template": {
                "metadata": {"labels": {"tflab.lab": name, "tflab.role": job}},
                "spec": _pod_spec(container, runs_claim, lf.config.shm_size, None),
            },
        }
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": _metadata(name, lf, namespace),
        # The ps never exits by itself: pods still running when the job ends are removed.
        "spec": {"runPolicy": {"cleanPodPolicy": "Running"}, "tfReplicaSpecs": specs},
    }
    return manifest


def jobset_host(jobset: str, node: str) -> str:
    """A JobSet pod's DNS name: JOBSET-REPLICATEDJOB-JOBINDEX-PODINDEX.SUBDOMAIN (the subdomain is the JobSet's)."""
    return f"{jobset}-{node}-0-0.{jobset}"


def jobset(lf: LabFiles, image: str, task: cfg.Task, runs_claim: str, namespace: str | None = None) -> dict[str, Any]:
    """A JobSet: one replicated job per node, each with the TF_CONFIG tflab writes for it."""
    lab = lf.lab
    # Pod host names are JOBSET-NODE-0-0 and must stay a DNS label (63): leave room for the node.
    name = job_name(lf.config.name, 40)
    hosts = {n.name: f"{jobset_host(name, n.name)}:{GRPC_PORT}" for n in lab.nodes}
    cluster = {job: [hosts[h.split(":")[0]] for h in members] for job, members in lab.cluster.items()}
    replicated = []
    for node in lab.nodes:
        tf_config = {"cluster": cluster, "task": {"type": node.job, "index": node.task_index}}
        values = {
            "node": node.name, "job_name": node.job, "task_index": str(node.task_index),
            "ps_hosts": ",".join(cluster.get("ps", [])), "worker_hosts": ",".join(cluster.get("worker", [])),
            "num_gpus": str(len(node.gpus)), "run_dir": tasks.run_dir(task.name),
        }
        env = {
            "TF_CONFIG": json.dumps(tf_config),
            "TFLAB_NODE": node.name, "TFLAB_JOB_NAME": node.job, "TFLAB_TASK_INDEX": str(node.task_index),
            "TFLAB_PS_HOSTS": values["ps_hosts"], "TFLAB_WORKER_HOSTS": values["worker_hosts"],
            **_env(lab, task, node.name),
        }
        line = cfg.fill_placeholders(task.command, values)
        container = _container(image, f"exec {line}", env, len(node.gpus))
        replicated.append({
            "name": node.name,
            "replicas": 1,
            "template": {
                "metadata": {"labels": {"tflab.lab": name, "tflab.node": node.name}},
                "spec": {
                    "parallelism": 1,
                    "completions": 1,
                    "backoffLimit": 0,
                    "template": {
                        "metadata": {"labels": {"tflab.lab": name, "tflab.node": node.name}},
                        "spec": _pod_spec(container, runs_claim, lf.config.shm_size, "Never"),
                    },
                },
            },
        })
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": _metadata(name, lf, namespace),
        "spec": {
            "network": {"enableDNSHostnames": True},
            # The chief's success is the job's: the parameter servers never end by themselves.
            "successPolicy": {"operator": "All", "targetReplicatedJobs": [lab.chief.name]},
            "failurePolicy": {"maxRestarts": 0},
            "replicatedJobs": replicated,
        },
    }


def webhook_problems(manifest: dict[str, Any]) -> list[str]:
    """What the Kubeflow training operator's admission webhook would refuse in a TFJob."""
    problems = []
    name = manifest.get("metadata", {}).get("name", "")
    if not DNS_1035.match(name) or len(name) > 63:
        problems.append(f"metadata.name {name!r} is not a DNS-1035 label")
    spec = manifest.get("spec", {})
    policy = spec.get("runPolicy", {}).get("cleanPodPolicy")
    if policy is not None and policy not in CLEAN_POD_POLICIES:
        problems.append(f"spec.runPolicy.cleanPodPolicy {policy!r} is not one of {', '.join(CLEAN_POD_POLICIES)}")
    replica_specs = spec.get("tfReplicaSpecs") or {}
    if not replica_specs:
        problems.append("spec.tfReplicaSpecs is empty")
    if sum(1 for kind in replica_specs if kind.lower() in ("chief", "master")) > 1:
        problems.append("spec.tfReplicaSpecs has more than one Chief/Master")
    for kind, replica in replica_specs.items():
        where = f"spec.tfReplicaSpecs.{kind}"
        if not isinstance(replica, dict):
            continue
        restart = replica.get("restartPolicy")
        if restart is not None and restart not in RESTART_POLICIES:
            problems.append(f"{where}.restartPolicy {restart!r} is not one of {', '.join(RESTART_POLICIES)}")
        if kind.lower() in ("chief", "master") and replica.get("replicas", 1) != 1:
            problems.append(f"{where}.replicas must be 1")
        containers = replica.get("template", {}).get("spec", {}).get("containers", [])
        named = [c for c in containers if c.get("name") == "tensorflow"]
        if not named:
            problems.append(f"{where}: no container named tensorflow")
        elif not named[0].get("image"):
            problems.append(f"{where}: the tensorflow container has no image")
    return problems


def problems_of(manifest: dict[str, Any]) -> list[str]:
    """Everything wrong with a manifest: its CRD schema (strict) and, for a TFJob, the webhook's rules."""
    if manifest.get("kind") == "TFJob":
        return validate.schema_problems(manifest, validate.TFJOB_SCHEMA) + webhook_problems(manifest)
    if manifest.get("kind") == "JobSet":
        problems = validate.schema_problems(manifest, validate.JOBSET_SCHEMA)
        name = manifest.get("metadata", {}).get("name", "")
        if not DNS_1035.match(name):
            problems.append(f"metadata.name {name!r} is not a DNS-1035 label")
        return problems
    return [f"kind {manifest.get('kind')!r} is neither TFJob nor JobSet"]


def render_manifest(lf: LabFiles, kind: str, image: str | None, task_name: str | None, runs_claim: str,
                    namespace: str | None) -> str:
    """The validated manifest's YAML text (a UserError for any problem: nothing half-made is written)."""
    if kind not in KINDS:
        raise UserError(f"--kind must be tfjob or jobset, not {kind!r}")
    if not image:
        raise UserError("render k8s needs --image: an image the cluster can pull with the code in /workspace "
                        "(`tflab build --bake` makes one; push it to the cluster's registry)")
    if not DNS_1035.match(runs_claim) and not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", runs_claim):
        raise UserError(f"--runs-claim {runs_claim!r} is not a Kubernetes name")
    task = pick_task(lf, task_name)
    manifest = (tfjob if kind == "tfjob" else jobset)(lf, image, task, runs_claim, namespace)
    problems = problems_of(manifest)
    if problems:
        raise UserError(f"the {KINDS[kind]} tflab made does not validate: {problems[0]}")
    header = (f"# {KINDS[kind]} of tflab lab {lf.config.name}: task {task.name} ({shlex.quote(task.command)[:80]}).\n"
              f"# Validated against the CRD schema (strict) by `tflab render k8s`. Runs folder: PVC {runs_claim}.\n")
    return header + yaml.safe_dump(manifest, sort_keys=False, width=1000)


__all__ = ["KINDS", "jobset", "jobset_host", "node_name", "problems_of", "render_manifest", "tfjob"]
