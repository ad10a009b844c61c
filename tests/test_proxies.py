"""The lab's own traffic never goes to a proxy: NO_PROXY names every node where the nodes carry proxy variables, on
every target (compose, stack, Kubernetes; the Slurm script's own lines: test_slurm), and a run's `--env` proxies."""

from __future__ import annotations

import json
from pathlib import Path

import docker
import pytest
import yaml

from tflab.host import buildsettings, dockerconfig, labfiles
from tflab.plan import config as cfg
from tflab.plan import knobs, proxies
from tflab.plan.topology import Topology
from tflab.render import k8s, templates

PROXY = "http://user:secret@proxy.corp:3128"
TRAIN = cfg.Task("train", "python /workspace/mnist_async.py --job_name={job_name} --task_index={task_index}")


@pytest.fixture
def client_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A Docker client configuration whose `proxies` the client puts into every container (DOCKER_CONFIG)."""
    folder = tmp_path / "docker-config"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"proxies": {"default": {
        "httpProxy": PROXY, "httpsProxy": PROXY, "noProxy": "pypi.corp,.internal"}}}))
    monkeypatch.setenv("DOCKER_CONFIG", str(folder))
    return folder


def test_no_proxy_keeps_what_was_there_then_names_the_hosts_and_loopback_once() -> None:
    assert proxies.no_proxy(["ps0", "worker0"], "a.corp, .internal", ".internal,b") == \
        "a.corp,.internal,b,ps0,worker0,localhost,127.0.0.1,::1"
    assert proxies.no_proxy_env({"no_proxy": "x"}, ["ps0"]) == {}, "no proxy, nothing to pass by"
    assert proxies.no_proxy_env({"https_proxy": PROXY, "no_proxy": "x"}, ["ps0"]) == {
        "NO_PROXY": "x,ps0,localhost,127.0.0.1,::1", "no_proxy": "x,ps0,localhost,127.0.0.1,::1"}


def test_the_proxies_read_are_those_the_docker_sdk_puts_into_containers(client_config: Path) -> None:
    """Held to the real client: docker-py's own reading of the same file (the variables it injects)."""
    injected = docker.APIClient(base_url="unix:///var/run/docker.sock")._proxy_configs.get_environment()
    assert dockerconfig.container_proxies() == injected == {
        "http_proxy": PROXY, "HTTP_PROXY": PROXY, "https_proxy": PROXY, "HTTPS_PROXY": PROXY,
        "no_proxy": "pypi.corp,.internal", "NO_PROXY": "pypi.corp,.internal"}


def test_no_configuration_or_an_unreadable_one_puts_no_proxy(tmp_path: Path) -> None:
    assert dockerconfig.container_proxies({"DOCKER_CONFIG": str(tmp_path / "none")}) == {}
    (tmp_path / "config.json").write_text("{not json")
    assert dockerconfig.container_proxies({"DOCKER_CONFIG": str(tmp_path)}) == {}
    (tmp_path / "config.json").write_text(json.dumps({"proxies": {"tcp://other:2376": {"httpProxy": PROXY}}}))
    assert dockerconfig.container_proxies({"DOCKER_CONFIG": str(tmp_path)}) == {}, "another engine's proxies"


def write(tmp_path: Path, bind: str = "127.0.0.1", **kw) -> labfiles.LabFiles:
    config = cfg.LabConfig(name="px", topology=Topology(nodes=3, bind=bind), memlock=-1, tasks={"train": TRAIN}, **kw)
    return labfiles.write_lab(config, tmp_path / "lab", force=False)


EVERY_NODE = "pypi.corp,.internal,ps0,worker0,worker1,localhost,127.0.0.1,::1"


def test_a_compose_lab_behind_the_clients_proxies_names_every_node_in_no_proxy(tmp_path: Path,
                                                                               client_config: Path) -> None:
    lf = write(tmp_path)
    text = lf.compose_path.read_text()
    for node in yaml.safe_load(text)["services"].values():
        assert node["environment"]["NO_PROXY"] == node["environment"]["no_proxy"] == EVERY_NODE
    assert "secret" not in text and "HTTP_PROXY" not in text, "the proxies themselves are the client's to put"
    assert lf.write_compose("tflab-node:x"), "`up` writes it again, with the client's proxies as they are then"
    assert yaml.safe_load(lf.compose_path.read_text())["services"]["ps0"]["environment"]["NO_PROXY"] == EVERY_NODE


def test_without_proxies_the_nodes_get_no_no_proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "none"))
    lf = write(tmp_path)
    assert "NO_PROXY" not in lf.compose_path.read_text()


def test_a_stack_names_every_node_too(tmp_path: Path, client_config: Path) -> None:
    lf = write(tmp_path, bind="0.0.0.0")
    text = templates.stack_file(lf.lab, lf.config, lf.root, "img:1", ("k", "p"), "px", dockerconfig.container_proxies())
    for node in yaml.safe_load(text)["services"].values():
        assert node["environment"]["NO_PROXY"] == EVERY_NODE


def test_kubernetes_pods_pass_the_proxy_by_for_the_jobs_hosts(tmp_path: Path) -> None:
    lf = write(tmp_path)
    given = {"HTTPS_PROXY": PROXY}
    job = k8s.tfjob(lf.config, lf.lab, "img:1", TRAIN, "runs", node_proxies=given)
    env = {e["name"]: e["value"] for e in job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["env"]}
    assert env["NO_PROXY"] == env["no_proxy"] == ".svc,.svc.cluster.local,localhost,127.0.0.1,::1"
    jobset = k8s.jobset(lf.config, lf.lab, "img:1", TRAIN, "runs", node_proxies=given)
    pod = jobset["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in pod["env"]}
    assert env["NO_PROXY"] == "px-ps0-0-0.px,px-worker0-0-0.px,px-worker1-0-0.px,localhost,127.0.0.1,::1"
    assert k8s.problems_of(job) == [] and k8s.problems_of(jobset) == []
    plain = k8s.tfjob(lf.config, lf.lab, "img:1", TRAIN, "runs")
    assert "NO_PROXY" not in json.dumps(plain)


def test_a_runs_env_proxy_passes_the_proxy_by_for_the_lab(tmp_path: Path) -> None:
    lf = write(tmp_path)
    given = knobs.parse(lf.lab, 2, env=["http_proxy=http://proxy.corp:3128", "no_proxy=.corp"])
    changed = knobs.env_changes(lf.lab, knobs.run_lab(lf.lab, given), given)
    assert changed["worker1"]["no_proxy"] == changed["worker1"]["NO_PROXY"] == \
        ".corp,ps0,worker0,worker1,localhost,127.0.0.1,::1"
    assert given.env == {"http_proxy": "http://proxy.corp:3128", "no_proxy": ".corp"}, "run.json keeps what was typed"
    plain = knobs.parse(lf.lab, 2, env=["BATCH=64"])
    assert "NO_PROXY" not in knobs.env_changes(lf.lab, knobs.run_lab(lf.lab, plain), plain)["worker1"]


def test_a_build_gets_the_clients_proxies_through_its_mounted_settings(client_config: Path) -> None:
    """As `docker build` hands them to a build: in the mounted proxy.env, never in a container's environment."""
    settings = buildsettings.pip_settings(lambda argv, **kw: "", {"DOCKER_CONFIG": str(client_config)})
    assert settings.env["https_proxy"] == PROXY and settings.env["NO_PROXY"] == "pypi.corp,.internal"
    mine = buildsettings.pip_settings(lambda argv, **kw: "", {"DOCKER_CONFIG": str(client_config),
                                                               "https_proxy": "http://mine:1"})
    assert mine.env["https_proxy"] == "http://mine:1", "the host's own environment first"
