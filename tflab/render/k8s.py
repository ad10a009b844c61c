"""A lab as a Kubernetes manifest: a Kubeflow TFJob, or a JobSet for clusters without Kubeflow.

Pure: the lab in, a manifest (a dict) out, validated strictly against the CRD schemas tflab
ships and the rules the Kubeflow admission webhook enforces, before anything is written.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import yaml

from tflab.errors import TflabError, UserError
from tflab.plan import config as cfg
from tflab.plan import proxies, shares, tasks
from tflab.plan.shares import Share
from tflab.plan.topology import GRPC_PORT, Lab, Node, node_name
from tflab.render import schemas, templates

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


def pick_task(config: cfg.LabConfig, name: str | None) -> cfg.Task:
    """The task the manifest runs: the one named, else `train`, else the lab's first."""
    if name is not None:
        return config.task(name)
    if "train" in config.tasks:
        return config.tasks["train"]
    if not config.tasks:
        raise UserError("the lab has no task to run; add one to tflab.yaml (tasks:) or pass --task")
    return next(iter(config.tasks.values()))


def _resources(share: Share, gpus: int) -> dict[str, Any]:
    """A node's share of the host as a pod asks for it: requests equal to limits (the Guaranteed QoS class, where the
    kubelet's static CPU manager gives whole CPUs to the pod alone, as the lab's cpuset does)."""
    owned: dict[str, Any] = {}
    if share.cpus is not None:
        cpus = share.cpus
        owned["cpu"] = str(int(cpus)) if cpus == int(cpus) else f"{int(round(cpus * 1000))}m"
    if share.memory_mib is not None:
        owned["memory"] = f"{share.memory_mib}Mi"
    resources: dict[str, Any] = {}
    if owned:
        resources = {"requests": dict(owned), "limits": dict(owned)}
    if gpus:
        resources.setdefault("limits", {})["nvidia.com/gpu"] = gpus
    return resources


def _container(image: str, shell: str, env: dict[str, str], gpus: int, share: Share) -> dict[str, Any]:
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
    resources = _resources(share, gpus)
    if resources:
        container["resources"] = resources
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
    return f"{templates.size_bytes(size) // 2**20}Mi"


def _env(lab: Lab, task: cfg.Task, node: str, lab_wide: Mapping[str, str]) -> dict[str, str]:
    base = {k: v for k, v in lab.node(node).env.items() if k in ("PYTHONUNBUFFERED", "TF_CPP_MIN_LOG_LEVEL",
                                                                "TFLAB_NUM_GPUS", "TFLAB_GPU_MEMORY_MB",
                                                                "TFLAB_GPU_MEMORY_FRACTION", "TFLAB_NUM_CPUS",
                                                                "TFLAB_MEMORY_MB", "OMP_NUM_THREADS",
                                                                "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")}
    return {**base, **lab_wide, **tasks.task_env(task.name)}


# A TFJob's hosts are its pods' services, NAME-TYPE-INDEX.NAMESPACE.svc: no proxy for anything in the cluster.
CLUSTER_DOMAINS = (".svc", ".svc.cluster.local")


def lab_wide_env(config: cfg.LabConfig, hosts: list[str], node_proxies: Mapping[str, str] | None) -> dict[str, str]:
    """What every pod sees of the lab's choices: Keras 2's switch; NO_PROXY naming the job's hosts where the pods
    would carry proxy variables (`node_proxies`, as the nodes here do)."""
    return {**cfg.keras_env(config.keras), **proxies.no_proxy_env(node_proxies or {}, hosts)}


LIST_OPERATORS = {";", "&", "&&", "|", "||", "(", ")", ";;"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


def exec_form(line: str) -> str:
    """A task's command as the container's shell runs it: `exec`ed (the program gets the pod's signals)
    where it is one simple command; as written where `exec` would change it (`a && b`, `VAR=x prog`,
    a pipe, or an `exec` of its own)."""
    try:
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError as exc:
        raise UserError(f"the task's command {line!r} is not a shell command ({exc})") from None
    if "\n" in line or not words or LIST_OPERATORS & set(words) or ASSIGNMENT.match(words[0]) or words[0] == "exec":
        return line
    return f"exec {line}"


def one_line(text: str) -> str:
    """A text for a comment line: newlines and other control characters written as escapes."""
    return re.sub(r"[\x00-\x1f\x7f]", lambda m: f"\\x{ord(m.group()):02x}", text)


NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def _metadata(name: str, config: cfg.LabConfig, namespace: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"tflab.lab": job_name(config.name, 63)}}
    if namespace:
        meta["namespace"] = namespace
    return meta


def tfjob(config: cfg.LabConfig, lab: Lab, image: str, task: cfg.Task, runs_claim: str,
          namespace: str | None = None, node_proxies: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A Kubeflow TFJob: one replica spec per role; the operator writes each pod's TF_CONFIG."""
    name = job_name(config.name, 63)
    lab_wide = lab_wide_env(config, list(CLUSTER_DOMAINS), node_proxies)
    specs: dict[str, Any] = {}
    for job, kind in TFJOB_TYPES.items():
        members = [n for n in lab.nodes if n.job == job]
        if not members:
            continue
        values = {**RUNTIME_VALUES, "num_gpus": str(len(members[0].gpus)), "run_dir": tasks.run_dir(task.name)}
        line = f"{FROM_TF_CONFIG} && {exec_form(cfg.fill_placeholders(task.command, values))}"
        container = _container(image, line, _env(lab, task, members[0].name, lab_wide), len(members[0].gpus),
                               members[0].share)
        specs[kind] = {
            "replicas": len(members),
            "restartPolicy": "OnFailure" if job != "ps" else "Never",
            "template": {
                "metadata": {"labels": {"tflab.lab": name, "tflab.role": job}},
                "spec": _pod_spec(container, runs_claim, config.shm_size, None),
            },
        }
    manifest = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": _metadata(name, config, namespace),
        # The ps never exits by itself: pods still running when the job ends are removed.
        "spec": {"runPolicy": {"cleanPodPolicy": "Running"}, "tfReplicaSpecs": specs},
    }
    return manifest


def jobset_host(jobset: str, node: str) -> str:
    """A JobSet pod's DNS name: JOBSET-REPLICATEDJOB-JOBINDEX-PODINDEX.SUBDOMAIN (the subdomain is the JobSet's)."""
    return f"{jobset}-{node}-0-0.{jobset}"


def jobset(config: cfg.LabConfig, lab: Lab, image: str, task: cfg.Task, runs_claim: str,
           namespace: str | None = None, node_proxies: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A JobSet: one replicated job per node, each with the TF_CONFIG tflab writes for it."""
    # Pod host names are JOBSET-NODE-0-0 and must stay a DNS label (63): leave room for the node.
    name = job_name(config.name, 40)
    hosts = {n.name: f"{jobset_host(name, n.name)}:{GRPC_PORT}" for n in lab.nodes}
    cluster = {job: [hosts[h.split(":")[0]] for h in members] for job, members in lab.cluster.items()}
    lab_wide = lab_wide_env(config, [host.rsplit(":", 1)[0] for host in hosts.values()], node_proxies)
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
            **_env(lab, task, node.name, lab_wide),
        }
        line = cfg.fill_placeholders(task.command, values)
        container = _container(image, exec_form(line), env, len(node.gpus), node.share)
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
                        "spec": _pod_spec(container, runs_claim, config.shm_size, "Never"),
                    },
                },
            },
        })
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": _metadata(name, config, namespace),
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
        return schemas.schema_problems(manifest, schemas.TFJOB_SCHEMA) + webhook_problems(manifest)
    if manifest.get("kind") == "JobSet":
        problems = schemas.schema_problems(manifest, schemas.JOBSET_SCHEMA)
        name = manifest.get("metadata", {}).get("name", "")
        if not DNS_1035.match(name):
            problems.append(f"metadata.name {name!r} is not a DNS-1035 label")
        return problems
    return [f"kind {manifest.get('kind')!r} is neither TFJob nor JobSet"]


def sized(lab: Lab, cpus: str | None, memory: str | None) -> Lab:
    """The lab with every pod sized for the cluster, not this host: `cpus` (a number, or 0 for none asked) and
    `memory` (a size, or 0 for none asked) in place of each node's share here; None keeps the share."""
    if cpus is None and memory is None:
        return lab
    cpu_choice = shares.check_cpu_choice(cpus, "--cpus-per-node") if cpus is not None else None
    if cpu_choice == shares.AUTO:
        raise UserError("--cpus-per-node auto is this host's share, which render k8s gives without it: name a "
                        "number of CPUs for each pod, or 0 to ask for none")
    memory_choice = shares.check_memory_choice(memory, "--memory-per-node") if memory is not None else None
    if memory_choice == shares.AUTO:
        raise UserError("--memory-per-node auto is this host's share, which render k8s gives without it: name a "
                        "size for each pod, or 0 to ask for none")

    def share_of(node: Node) -> Share:
        share = node.share
        if cpu_choice is not None:
            share = replace(share, cpuset=(), numa=None,
                            quota=None if cpu_choice == shares.SHARED else float(cpu_choice))
        if memory_choice is not None:
            share = replace(share, memory_mib=None if memory_choice == shares.SHARED
                            else shares.size_mib(memory_choice, "--memory-per-node"))
        return share

    return replace(lab, nodes=tuple(replace(node, share=share_of(node)) for node in lab.nodes))


def render_manifest(config: cfg.LabConfig, lab: Lab, kind: str, image: str | None, task_name: str | None, runs_claim: str,
                    namespace: str | None, node_proxies: Mapping[str, str] | None = None) -> str:
    """The validated manifest's YAML text (a UserError for any problem: nothing half-made is written)."""
    if kind not in KINDS:
        raise UserError(f"--kind must be tfjob or jobset, not {kind!r}")
    if not image:
        raise UserError("render k8s needs --image: an image the cluster can pull with the code in /workspace "
                        "(`tflab build --bake` makes one; push it to the cluster's registry)")
    if not DNS_1035.match(runs_claim) and not re.match(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", runs_claim):
        raise UserError(f"--runs-claim {runs_claim!r} is not a Kubernetes name")
    if namespace is not None and (len(namespace) > 63 or not NAMESPACE.fullmatch(namespace)):
        raise UserError(f"--namespace {namespace!r} is not a Kubernetes namespace: lower-case letters, digits "
                        "and -, starting and ending with a letter or digit, at most 63")
    task = pick_task(config, task_name)
    manifest = (tfjob if kind == "tfjob" else jobset)(config, lab, image, task, runs_claim, namespace, node_proxies)
    problems = problems_of(manifest)
    if problems:
        # The lab and the options were fine (checked above): a manifest that fails is tflab's own fault.
        raise TflabError(f"tflab made a {KINDS[kind]} that does not validate ({problems[0]}); this is a bug "
                         "in tflab: please report it with the lab's tflab.yaml")
    header = (f"# {KINDS[kind]} of tflab lab {one_line(config.name)}: task {task.name} "
              f"({one_line(shlex.quote(task.command)[:80])}).\n"
              f"# Validated against the CRD schema (strict) by `tflab render k8s`. Runs folder: PVC {runs_claim}.\n")
    return header + yaml.safe_dump(manifest, sort_keys=False, width=1000)


__all__ = ["KINDS", "jobset", "jobset_host", "node_name", "problems_of", "render_manifest", "tfjob"]
