"""Generated files: the compose file by meaning and through `docker compose config`."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from tflab.host import labfiles
from tflab.plan import config as cfg
from tflab.plan.gpus import Gpu
from tflab.plan.links import Links
from tflab.plan.topology import Topology
from tflab.render import image_files, templates


def write(tmp_path: Path, **kw) -> labfiles.LabFiles:
    topology = kw.pop("topology", Topology(nodes=4, gpus_per_node=2))
    kw.setdefault("memlock", -1)
    config = cfg.LabConfig(name="ref", topology=topology, gpus=tuple(Gpu(i) for i in range(8)), **kw)
    return labfiles.write_lab(config, tmp_path / "lab", force=False)


def test_reference_compose_file_by_meaning(tmp_path: Path) -> None:
    lf = write(tmp_path)
    doc = yaml.safe_load(lf.compose_path.read_text())
    assert doc["name"] == lf.project
    assert list(doc["services"]) == ["ps0", "worker0", "worker1", "worker2"]
    worker1 = doc["services"]["worker1"]
    assert worker1["hostname"] == "worker1"
    assert worker1["networks"]["lab"]["aliases"] == ["worker1"]
    assert worker1["deploy"]["resources"]["reservations"]["devices"] == [
        {"driver": "nvidia", "device_ids": ["4", "5"], "capabilities": ["gpu"]}
    ]
    assert worker1["ports"] == [
        {"target": 22, "published": "20024", "host_ip": "127.0.0.1", "protocol": "tcp"},
        {"target": 6006, "published": "26008", "host_ip": "127.0.0.1", "protocol": "tcp"},
    ]
    assert worker1["environment"]["TFLAB_WORKER_HOSTS"] == "worker0:2222,worker1:2222,worker2:2222"
    assert worker1["labels"]["tflab.lab"] == lf.project
    assert worker1["restart"] == "unless-stopped"
    assert worker1["shm_size"] == "2g"
    assert worker1["ulimits"] == {"memlock": -1, "stack": 67108864}
    assert {"type": "bind", "source": "./keys", "target": "/etc/tflab/keys", "read_only": True} in worker1["volumes"]
    assert {"type": "bind", "source": "./runs", "target": "/runs", "read_only": False} in worker1["volumes"]
    assert 2222 not in [p["target"] for p in worker1["ports"]]  # gRPC stays inside the lab network
    assert doc["networks"]["lab"]["labels"]["tflab.lab"] == lf.project


def test_cpu_lab_has_no_gpu_reservation_and_mounted_data_is_read_only(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    lf = write(tmp_path, topology=Topology(nodes=2), data="../data", data_mode="mount")
    doc = yaml.safe_load(lf.compose_path.read_text())
    assert "deploy" not in doc["services"]["worker0"]
    assert {"type": "bind", "source": "../data", "target": "/data", "read_only": True} in doc["services"]["worker0"]["volumes"]


def test_dockerfile_names_its_base_and_bakes_no_key(tmp_path: Path) -> None:
    lf = write(tmp_path, base_image=cfg.LOCAL_BASE)
    dockerfile = (lf.image_dir / "Dockerfile").read_text()
    assert [line for line in dockerfile.splitlines() if line.startswith(("FROM", "ARG"))] == [
        "ARG BASE_IMAGE=tflab-base:cpu", "FROM ${BASE_IMAGE}"]
    assert "id_ed25519" not in dockerfile and "/etc/tflab/keys" not in dockerfile
    assert sorted(p.name for p in lf.image_dir.iterdir()) == [
        "Dockerfile", "entrypoint.sh", "fault.sh", "guard.pyz", "one_tensorflow.py", "shape.sh", "sshd_config"]
    assert os.access(lf.image_dir / "guard.pyz", os.X_OK) and os.access(lf.image_dir / "shape.sh", os.X_OK)


def test_shaped_links_get_net_admin_and_their_settings_and_nothing_else_does(tmp_path: Path) -> None:
    """Every node may read its own processes' stacks (py-spy: SYS_PTRACE); only a shaped lab changes its network."""
    plain = yaml.safe_load(write(tmp_path / "a").compose_path.read_text())
    assert plain["services"]["worker0"]["cap_add"] == ["SYS_PTRACE"]
    assert not any(k.startswith("TFLAB_LINK") for k in plain["services"]["worker0"]["environment"])
    shaped = yaml.safe_load(write(tmp_path / "b", links=Links(rate="100mbit", delay_ms=5.0)).compose_path.read_text())
    worker0 = shaped["services"]["worker0"]
    assert worker0["cap_add"] == ["SYS_PTRACE", "NET_ADMIN"]
    assert {k: v for k, v in worker0["environment"].items() if k.startswith("TFLAB_LINK")} == {
        "TFLAB_LINK_RATE": "100mbit", "TFLAB_LINK_BURST": "125000", "TFLAB_LINK_DELAY_MS": "5"}


def test_memlock_is_left_to_the_engine_unless_set(tmp_path: Path) -> None:
    doc = yaml.safe_load(write(tmp_path, memlock=None).compose_path.read_text())
    assert doc["services"]["ps0"]["ulimits"] == {"stack": 67108864}


def test_image_tag_follows_the_build_context(tmp_path: Path) -> None:
    lf = write(tmp_path)
    tag = lf.image_tag()
    assert tag == image_files.image_tag(lf.image_context()) and tag.startswith("tflab-node:")
    assert lf.image_tag("sha256:another-base") != tag  # a rebuilt base means a new node image
    (lf.image_dir / "Dockerfile").write_text((lf.image_dir / "Dockerfile").read_text() + "# edit\n")
    assert lf.image_tag() != tag


def test_project_names_are_unique_per_folder(tmp_path: Path) -> None:
    assert templates.project_name("Lab 1", tmp_path / "a") != templates.project_name("Lab 1", tmp_path / "b")
    assert templates.project_name("Lab 1", tmp_path / "a").startswith("tflab-lab-1-")


@pytest.mark.parametrize("topology", [
    Topology(nodes=4, gpus_per_node=2),
    Topology(nodes=3, ps=0),
    Topology(nodes=3, chief=True, evaluator=True, gpus_per_node=1),
    Topology(nodes=6, gpus_per_node=2, share_gpus=True, bind="0.0.0.0"),
])
@pytest.mark.compose
def test_docker_compose_config_accepts_generated_files(tmp_path: Path, compose_argv: list[str], topology: Topology) -> None:
    lf = write(tmp_path, topology=topology)
    done = subprocess.run([*compose_argv, "-f", str(lf.compose_path), "config", "--quiet"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    done = subprocess.run([*compose_argv, "-f", str(lf.compose_path), "config", "--services"],
                          capture_output=True, text=True, check=True)
    assert sorted(done.stdout.split()) == sorted(lf.lab.names)
