"""Kubernetes manifests of a lab, checked offline against the CRD schemas (strictly) and the webhook's rules."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml
from conftest import cli

from tflab.host import labfiles
from tflab.plan import config as cfg
from tflab.plan.gpus import Gpu
from tflab.plan.topology import Topology
from tflab.render import k8s, schemas

TRAIN = cfg.Task("train", "python /workspace/mnist_async.py --job_name={job_name} --task_index={task_index} "
                          "--ps_hosts={ps_hosts} --worker_hosts={worker_hosts} --log_dir={run_dir}")


def lab(tmp_path: Path, **topology) -> labfiles.LabFiles:
    config = cfg.LabConfig(name="Ref Lab", topology=Topology(**topology), gpus=tuple(Gpu(i) for i in range(8)),
                           tasks={"train": TRAIN})
    return labfiles.write_lab(config, tmp_path / "lab", force=False)


def container(replica: dict) -> dict:
    return replica["template"]["spec"]["containers"][0]


def test_reference_tfjob_by_value(tmp_path: Path) -> None:
    lf = lab(tmp_path, nodes=4, gpus_per_node=2)
    job = k8s.tfjob(lf.config, lf.lab, "registry.example/lab:1", TRAIN, "tflab-runs")
    assert k8s.problems_of(job) == []
    assert (job["apiVersion"], job["kind"], job["metadata"]["name"]) == ("kubeflow.org/v1", "TFJob", "ref-lab")
    assert job["spec"]["runPolicy"] == {"cleanPodPolicy": "Running"}
    specs = job["spec"]["tfReplicaSpecs"]
    assert {kind: spec["replicas"] for kind, spec in specs.items()} == {"PS": 1, "Worker": 3}
    for spec in specs.values():
        worker = container(spec)
        assert worker["name"] == "tensorflow" and worker["image"] == "registry.example/lab:1"
        assert worker["resources"] == {"limits": {"nvidia.com/gpu": 2}}
        assert "TF_CONFIG" not in {e["name"] for e in worker["env"]}  # the operator injects it
        assert {"name": "runs", "persistentVolumeClaim": {"claimName": "tflab-runs"}} in spec["template"]["spec"]["volumes"]
        assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "2048Mi"}} in spec["template"]["spec"]["volumes"]
    assert container(specs["Worker"])["args"][0].endswith(
        "exec python /workspace/mnist_async.py --job_name=${TFLAB_JOB_NAME} --task_index=${TFLAB_TASK_INDEX} "
        "--ps_hosts=${TFLAB_PS_HOSTS} --worker_hosts=${TFLAB_WORKER_HOSTS} --log_dir=/runs/train")


def test_reference_jobset_writes_tf_config_with_the_pods_host_names(tmp_path: Path) -> None:
    lf = lab(tmp_path, nodes=4, gpus_per_node=2)
    jobset = k8s.jobset(lf.config, lf.lab, "registry.example/lab:1", TRAIN, "runs-claim")
    assert k8s.problems_of(jobset) == []
    assert jobset["spec"]["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["worker0"]}
    jobs = {job["name"]: job for job in jobset["spec"]["replicatedJobs"]}
    assert list(jobs) == ["ps0", "worker0", "worker1", "worker2"] and all(j["replicas"] == 1 for j in jobs.values())
    pod = jobs["worker1"]["template"]["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in pod["containers"][0]["env"]}
    assert json.loads(env["TF_CONFIG"]) == {
        "cluster": {"ps": ["ref-lab-ps0-0-0.ref-lab:2222"],
                    "worker": ["ref-lab-worker0-0-0.ref-lab:2222", "ref-lab-worker1-0-0.ref-lab:2222",
                               "ref-lab-worker2-0-0.ref-lab:2222"]},
        "task": {"type": "worker", "index": 1},
    }
    assert pod["containers"][0]["args"] == [
        "exec python /workspace/mnist_async.py --job_name=worker --task_index=1 --ps_hosts=ref-lab-ps0-0-0.ref-lab:2222 "
        "--worker_hosts=ref-lab-worker0-0-0.ref-lab:2222,ref-lab-worker1-0-0.ref-lab:2222,"
        "ref-lab-worker2-0-0.ref-lab:2222 --log_dir=/runs/train"]
    assert pod["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 2}}
    assert pod["restartPolicy"] == "Never"


def test_chief_and_evaluator_labs(tmp_path: Path) -> None:
    lf = lab(tmp_path, nodes=3, chief=True, evaluator=True)
    job = k8s.tfjob(lf.config, lf.lab, "img:1", TRAIN, "runs")
    assert k8s.problems_of(job) == []
    assert {k: v["replicas"] for k, v in job["spec"]["tfReplicaSpecs"].items()} == {
        "PS": 1, "Worker": 2, "Chief": 1, "Evaluator": 1}
    assert "resources" not in container(job["spec"]["tfReplicaSpecs"]["Chief"])  # a CPU lab
    jobset = k8s.jobset(lf.config, lf.lab, "img:1", TRAIN, "runs")
    assert k8s.problems_of(jobset) == []
    jobs = {j["name"]: j for j in jobset["spec"]["replicatedJobs"]}
    assert list(jobs) == ["ps0", "worker0", "worker1", "chief", "evaluator"]
    assert jobset["spec"]["successPolicy"]["targetReplicatedJobs"] == ["chief"]
    env = {e["name"]: e["value"] for e in jobs["evaluator"]["template"]["spec"]["template"]["spec"]["containers"][0]["env"]}
    tf_config = json.loads(env["TF_CONFIG"])
    assert tf_config["task"] == {"type": "evaluator", "index": 0}
    assert tf_config["cluster"]["chief"] == ["ref-lab-chief-0-0.ref-lab:2222"]
    assert "evaluator" not in tf_config["cluster"]


def test_a_misspelled_field_fails_the_strict_check_that_the_plain_schema_lets_through(tmp_path: Path) -> None:
    lf = lab(tmp_path, nodes=4, gpus_per_node=2)
    job = k8s.tfjob(lf.config, lf.lab, "img:1", TRAIN, "runs")
    job["spec"]["tfReplicaSpecs"]["Worker"]["restartPolice"] = "Never"
    assert schemas.schema_problems(job, schemas.TFJOB_SCHEMA, strict=False) == []
    assert k8s.problems_of(job) == ["spec.tfReplicaSpecs.Worker: 'restartPolice' is not a field here"]
    jobset = k8s.jobset(lf.config, lf.lab, "img:1", TRAIN, "runs")
    jobset["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"][0]["imagePullPolisy"] = "x"
    assert k8s.problems_of(jobset) == [
        "spec.replicatedJobs[1].template.spec.template.spec.containers[0]: 'imagePullPolisy' is not a field here"]


def test_the_webhooks_rules(tmp_path: Path) -> None:
    lf = lab(tmp_path, nodes=3, chief=True)
    good = k8s.tfjob(lf.config, lf.lab, "img:1", TRAIN, "runs")
    two_chiefs = copy.deepcopy(good)
    two_chiefs["spec"]["tfReplicaSpecs"]["Master"] = copy.deepcopy(good["spec"]["tfReplicaSpecs"]["Chief"])
    assert "spec.tfReplicaSpecs has more than one Chief/Master" in k8s.problems_of(two_chiefs)
    bad = copy.deepcopy(good)
    bad["metadata"]["name"] = "Ref_Lab"
    bad["spec"]["runPolicy"]["cleanPodPolicy"] = "Sometimes"
    bad["spec"]["tfReplicaSpecs"]["Worker"]["restartPolicy"] = "Maybe"
    container(bad["spec"]["tfReplicaSpecs"]["PS"])["name"] = "tf"
    assert k8s.problems_of(bad) == [
        "metadata.name 'Ref_Lab' is not a DNS-1035 label",
        "spec.runPolicy.cleanPodPolicy 'Sometimes' is not one of All, Running, None",
        "spec.tfReplicaSpecs.PS: no container named tensorflow",
        "spec.tfReplicaSpecs.Worker.restartPolicy 'Maybe' is not one of Always, OnFailure, Never, ExitCode",
    ]


def test_render_k8s_writes_a_validated_manifest_or_nothing(runner, tmp_path: Path) -> None:
    lf = lab(tmp_path, nodes=4, gpus_per_node=2)
    out = tmp_path / "tfjob.yaml"
    result = runner.invoke(cli, ["render", "k8s", "--lab", str(lf.root), "--image", "reg.example/lab:1",
                                 "--runs-claim", "my-runs", "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    written = yaml.safe_load(out.read_text())
    assert written["kind"] == "TFJob" and k8s.problems_of(written) == []
    assert written["spec"]["tfReplicaSpecs"]["PS"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"] == {
        "claimName": "my-runs"}
    printed = runner.invoke(cli, ["render", "k8s", "--lab", str(lf.root), "--kind", "jobset", "--image", "x:1"])
    assert printed.exit_code == 0 and yaml.safe_load(printed.stdout)["kind"] == "JobSet"
    for args, message in ((["--kind", "deployment", "--image", "x"], "--kind must be tfjob or jobset, not 'deployment'"),
                          ([], "render k8s needs --image"),
                          (["--image", "x", "--task", "nope"], "no task 'nope' in tflab.yaml")):
        target = tmp_path / "never.yaml"
        failed = runner.invoke(cli, ["render", "k8s", "--lab", str(lf.root), "-o", str(target), *args])
        assert failed.exit_code == 2 and message in failed.stderr and len(failed.stderr.strip().splitlines()) == 1
        assert not target.exists()


@pytest.mark.parametrize(("command", "runs"), [
    ("python t.py --x 1", "exec python t.py --x 1"),
    ("VAR=x python t.py", "VAR=x python t.py"),  # `exec VAR=x …` exits 127 in every pod (issue 30.7)
    ("python prep.py && python t.py", "python prep.py && python t.py"),  # exec would drop the rest
    ("python t.py | tee /runs/log", "python t.py | tee /runs/log"),
    ("exec python t.py", "exec python t.py"),
    ("python t.py 'a && b'", "exec python t.py 'a && b'"),
])
def test_a_task_is_execed_only_where_exec_keeps_its_meaning(tmp_path: Path, command: str, runs: str) -> None:
    config = cfg.LabConfig(name="x", topology=Topology(nodes=2), tasks={"t": cfg.Task("t", command)})
    lf = labfiles.write_lab(config, tmp_path / "lab", force=False)
    jobset = yaml.safe_load(k8s.render_manifest(lf.config, lf.lab, "jobset", "x:1", "t", "runs", None))
    args = container(jobset["spec"]["replicatedJobs"][0]["template"]["spec"])["args"]
    assert args[-1] == runs
    tfjob = yaml.safe_load(k8s.render_manifest(lf.config, lf.lab, "tfjob", "x:1", "t", "runs", None))
    assert container(tfjob["spec"]["tfReplicaSpecs"]["PS"])["args"][-1].endswith(f" && {runs}")


def test_text_with_newlines_stays_in_the_header_comment_and_namespaces_are_checked(runner, tmp_path: Path) -> None:
    config = cfg.LabConfig(name="x", topology=Topology(nodes=2),
                           tasks={"t": cfg.Task("t", "python t.py\nkind: Injected\n")})
    lf = labfiles.write_lab(config, tmp_path / "lab", force=False)
    text = k8s.render_manifest(lf.config, lf.lab, "tfjob", "x:1", "t", "runs", None)
    assert yaml.safe_load(text)["kind"] == "TFJob"
    assert [line for line in text.splitlines() if "Injected" in line][0].startswith("# ")
    for bad in ("Team-A", "-a", "a" * 64, "a_b", "ns\nkind: x"):
        target = tmp_path / "never.yaml"
        failed = runner.invoke(cli, ["render", "k8s", "--lab", str(lf.root), "--image", "x:1", "--namespace", bad,
                                     "-o", str(target)])
        assert failed.exit_code == 2 and "is not a Kubernetes namespace" in failed.stderr, failed.stderr
        assert not target.exists()
    ok = runner.invoke(cli, ["render", "k8s", "--lab", str(lf.root), "--image", "x:1", "--namespace", "team-a"])
    assert ok.exit_code == 0 and yaml.safe_load(ok.stdout.split("\n", 2)[2])["metadata"]["namespace"] == "team-a"


@pytest.mark.parametrize("name", [schemas.TFJOB_SCHEMA, schemas.JOBSET_SCHEMA, schemas.STACK_SCHEMA])
def test_the_shipped_schemas_are_the_recorded_copies_of_the_project_shared_ones(name: str) -> None:
    """The hashes recorded beside the shipped schemas; where the project's shared folder is beside this
    checkout (not in a clone elsewhere), its schemas are the same bytes."""
    import hashlib

    from tflab import resources

    folder = resources.path(resources.SCHEMAS)
    recorded = dict(line.split()[::-1] for line in (folder / "README.md").read_text().splitlines()
                    if line.endswith(".json") and len(line.split()) == 2)
    assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == recorded[name]
    shared = Path(__file__).resolve().parents[2] / "shared" / "schemas" / name
    if shared.is_file():
        assert (folder / name).read_bytes() == shared.read_bytes()


def test_a_manifest_tflab_got_wrong_is_tflabs_fault_not_the_users(runner, tmp_path: Path, monkeypatch) -> None:
    lf = lab(tmp_path, nodes=2)
    real = k8s.tfjob

    def broken(*args, **kw):
        manifest = real(*args, **kw)
        manifest["spec"]["tfReplicaSpecs"]["PS"]["restartPolicy"] = "Sometimes"
        return manifest

    monkeypatch.setattr(k8s, "tfjob", broken)
    target = tmp_path / "tfjob.yaml"
    result = runner.invoke(cli, ["render", "k8s", "--lab", str(lf.root), "--image", "x:1", "-o", str(target)])
    assert result.exit_code == 1
    assert result.stderr.startswith("tflab: error: tflab made a Kubeflow TFJob (kubeflow.org/v1) that does not "
                                    "validate (spec.tfReplicaSpecs.PS.restartPolicy 'Sometimes' is not one of")
    assert "this is a bug in tflab" in result.stderr and not target.exists()


def test_render_k8s_sizes_each_pod_for_the_cluster_not_this_host(runner, tmp_path: Path, monkeypatch) -> None:
    """issue 63.11: the TFJob copied this host's small shares (half a CPU, 1 GiB) with no way to size it."""
    monkeypatch.setattr("tflab.host.ports.port_free", lambda host, port: True)
    root = tmp_path / "lab"
    made = runner.invoke(cli, ["gen", "--lab", str(root), "--nodes", "3", "--gpus-per-node", "0",
                               "--cpus-per-node", "0.5", "--memory-per-node", "1g"])
    assert made.exit_code == 0, made.stderr

    def resources(*args: str) -> dict:
        done = runner.invoke(cli, ["render", "k8s", "--lab", str(root), "--image", "x:1", *args])
        assert done.exit_code == 0, done.stderr
        manifest = yaml.safe_load(done.stdout)
        assert k8s.problems_of(manifest) == []
        return container(manifest["spec"]["tfReplicaSpecs"]["Worker"]).get("resources", {})

    here = {"cpu": "500m", "memory": "1024Mi"}
    assert resources() == {"limits": here, "requests": here}
    big = {"cpu": "8", "memory": "32768Mi"}
    assert resources("--cpus-per-node", "8", "--memory-per-node", "32g") == {"limits": big, "requests": big}
    assert resources("--cpus-per-node", "0", "--memory-per-node", "0") == {}
    assert resources("--cpus-per-node", "4") == {"limits": {"cpu": "4", "memory": "1024Mi"},
                                                 "requests": {"cpu": "4", "memory": "1024Mi"}}
    for args, message in ((["--cpus-per-node", "many"], "--cpus-per-node 'many' is not auto, 0, or a number"),
                          (["--memory-per-node", "32"], "--memory-per-node '32' is not a size"),
                          (["--cpus-per-node", "auto"], "--cpus-per-node auto is this host's share")):
        failed = runner.invoke(cli, ["render", "k8s", "--lab", str(root), "--image", "x:1", *args])
        assert failed.exit_code == 2 and message in failed.stderr and len(failed.stderr.strip().splitlines()) == 1
