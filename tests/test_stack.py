"""The swarm stack file, by meaning, against the v3.13 schema, and the lint of what stack deploy ignores."""

from __future__ import annotations

from pathlib import Path

import yaml

from tflab.engine.containers import SSHD_LISTENS
from tflab.host import labfiles
from tflab.plan import config as cfg
from tflab.plan.gpus import Gpu
from tflab.plan.links import Links
from tflab.plan.topology import Topology
from tflab.render import schemas, templates


def stack(tmp_path: Path, **kw) -> tuple[labfiles.LabFiles, dict]:
    topology = kw.pop("topology", Topology(nodes=4, gpus_per_node=2, bind="0.0.0.0"))
    config = cfg.LabConfig(name="ref", topology=topology, gpus=tuple(Gpu(i) for i in range(8)), target="swarm", **kw)
    lf = labfiles.write_lab(config, tmp_path / "lab", force=False)
    text = templates.stack_file(lf.lab, config, lf.root, "tflab-node:abc", ("key-1", "pub-1"))
    return lf, yaml.safe_load(text)


def test_reference_stack_by_meaning(tmp_path: Path) -> None:
    lf, doc = stack(tmp_path, swarm=cfg.SwarmSettings(place={"ps0": "gpu-a", "worker2": "gpu-b"}))
    assert schemas.stack_problems(doc) == []
    assert list(doc["services"]) == ["ps0", "worker0", "worker1", "worker2"]
    worker1 = doc["services"]["worker1"]
    assert (worker1["image"], worker1["hostname"], worker1["init"]) == ("tflab-node:abc", "worker1", True)
    assert worker1["deploy"]["replicas"] == 1 and worker1["deploy"]["endpoint_mode"] == "dnsrr"
    assert worker1["environment"]["NVIDIA_VISIBLE_DEVICES"] == "4,5"
    assert worker1["environment"]["TFLAB_WORKER_HOSTS"] == "worker0:2222,worker1:2222,worker2:2222"
    assert worker1["ports"] == [
        {"target": 22, "published": 20024, "protocol": "tcp", "mode": "host"},
        {"target": 6006, "published": 26008, "protocol": "tcp", "mode": "host"},
    ]
    assert {"type": "tmpfs", "target": "/dev/shm", "tmpfs": {"size": 2 * 2**30}} in worker1["volumes"]
    assert {"type": "bind", "source": str(lf.runs_dir), "target": "/runs", "read_only": False} in worker1["volumes"]
    assert worker1["networks"] == {"lab": {"aliases": ["worker1"]}}
    assert "placement" not in worker1["deploy"]
    assert doc["services"]["ps0"]["deploy"]["placement"] == {"constraints": ["node.labels.tflab.host == gpu-a"]}
    assert doc["networks"]["lab"]["driver"] == "overlay" and doc["networks"]["lab"]["attachable"] is True
    assert {name: s["name"] for name, s in doc["secrets"].items()} == {"lab_key": "key-1", "lab_key_pub": "pub-1"}
    for absent in ("ulimits", "devices", "shm_size", "build", "restart", "depends_on", "container_name"):
        assert absent not in worker1, absent
    assert worker1["cap_add"] == ["SYS_PTRACE"], "py-spy reads where a node's process waits"
    assert "resources" not in worker1["deploy"]


def test_links_and_memlock_when_asked(tmp_path: Path) -> None:
    _, doc = stack(tmp_path, links=Links(rate="1gbit"), memlock=-1)
    assert schemas.stack_problems(doc) == []
    worker0 = doc["services"]["worker0"]
    assert worker0["cap_add"] == ["SYS_PTRACE", "NET_ADMIN"] and worker0["environment"]["TFLAB_LINK_RATE"] == "1gbit"
    assert worker0["ulimits"] == {"memlock": -1}


def test_keys_stack_deploy_ignores_are_refused_with_a_sentence(tmp_path: Path) -> None:
    _, doc = stack(tmp_path)
    doc["services"]["worker0"]["devices"] = ["/dev/nvidia0:/dev/nvidia0"]
    doc["services"]["worker1"]["shm_size"] = "2g"
    assert schemas.stack_problems(doc) == [
        "services.worker0.devices is ignored by `docker stack deploy`: swarm passes no devices: GPUs go by "
        "NVIDIA_VISIBLE_DEVICES with the NVIDIA runtime as the default",
        "services.worker1.shm_size is ignored by `docker stack deploy`: swarm sets no shared memory size: mount a "
        "tmpfs volume at /dev/shm",
    ]


def test_device_reservations_are_refused_and_the_schema_is_applied(tmp_path: Path) -> None:
    _, doc = stack(tmp_path)
    doc["services"]["ps0"]["deploy"]["resources"] = {
        "reservations": {"devices": [{"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}]}}
    doc["services"]["ps0"]["ports"][0]["host_ip"] = "127.0.0.1"
    problems = schemas.stack_problems(doc)
    assert "services.ps0.deploy.resources.reservations: 'devices' is not a field here" in problems
    assert "services.ps0.ports[0]: 'host_ip' is not a field here" in problems
    assert any(p.startswith("services.ps0.deploy.resources.reservations.devices is refused by `docker stack deploy`")
               for p in problems)


def test_a_registry_that_does_not_answer_is_one_line_and_one_that_answers_passes() -> None:
    import http.server
    import socket
    import threading

    import pytest

    from tflab.engine.swarm_lab import check_registry
    from tflab.errors import UserError

    class V2(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/v2/" else 404)
            self.end_headers()

        def log_message(self, *args) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), V2)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        check_registry(f"127.0.0.1:{server.server_port}")
    finally:
        server.shutdown()
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(UserError) as refused:
        check_registry(f"127.0.0.1:{port}/team", timeout_s=1)
    assert str(refused.value) == (f"the registry 127.0.0.1:{port} does not answer (ConnectionError); start it, "
                                  "or make the lab with the --registry every swarm node pulls from")


def test_the_compose_file_and_the_stack_file_agree_on_every_setting_both_take(tmp_path: Path) -> None:
    """One node block (templates/_node.j2) in both files: what a node is does not depend on the engine."""
    lf, doc = stack(tmp_path, links=Links(rate="1gbit"), memlock=-1)
    compose = yaml.safe_load(templates.compose_file(lf.lab, lf.config, lf.root, "tflab-node:abc", project="ref"))
    shared = ("image", "hostname", "init", "working_dir", "cap_add", "networks")
    for node in lf.lab.names:
        ours, theirs = compose["services"][node], doc["services"][node]
        # a swarm's task is ready once the engine's check passes; a compose node is asked by `status` (the same)
        assert "healthcheck" not in ours
        assert theirs["healthcheck"]["test"] == ["CMD", *SSHD_LISTENS] and theirs["healthcheck"]["interval"] == "3s"
        for key in shared:
            assert ours[key] == theirs[key], (node, key)
        for label in ("tflab.node", "tflab.role", "tflab.gpus"):
            assert ours["labels"][label] == theirs["labels"][label]
        # the stack adds only what the swarm needs instead of devices: NVIDIA_VISIBLE_DEVICES
        assert {k: v for k, v in theirs["environment"].items() if k != "NVIDIA_VISIBLE_DEVICES"} == ours["environment"]
        # the same folders (the stack's paths absolute: a swarm resolves none), the lab's key aside: a secret there
        def folders(volumes: list) -> list:
            return [{**v, "source": str((lf.root / v["source"]).resolve())} for v in volumes
                    if v["type"] == "bind" and v["target"] != "/etc/tflab/keys"]

        assert folders(theirs["volumes"]) == folders(ours["volumes"])
        assert {"source": "lab_key", "target": "tflab_id_ed25519", "mode": 0o400} in theirs["secrets"]
        # memlock both take; the compose file's stack size is one stack deploy (on Docker before 23) drops
        assert theirs["ulimits"]["memlock"] == ours["ulimits"]["memlock"] == -1
