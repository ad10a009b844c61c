"""A node is a machine: the CPU and memory split, pure and with literal values, and through `gen`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import cli

from tflab.errors import UserError
from tflab.host import hardware
from tflab.plan import shares
from tflab.plan.gpus import parse_topo_numa, sysfs_bus_id
from tflab.plan.shares import HostFacts, Share, split
from tflab.plan.topology import Topology, plan
from tflab.render import k8s, templates

TWO_SOCKETS = HostFacts(cpus=tuple(range(32)), numa_cpus={0: tuple(range(16)), 1: tuple(range(16, 32))},
                        gpu_numa={g: 0 if g < 4 else 1 for g in range(8)}, memory_mib=512 * 1024)
PAIRS = [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_four_2_gpu_machines_of_a_two_socket_server_own_8_cores_of_their_gpus_socket() -> None:
    shares = split("auto", "auto", PAIRS, TWO_SOCKETS)
    assert [(s.cpuset, s.numa) for s in shares] == [
        (tuple(range(0, 8)), 0), (tuple(range(8, 16)), 0), (tuple(range(16, 24)), 1), (tuple(range(24, 32)), 1)]
    reserve = 16 * 1024  # a tenth of 512 GiB is more than the most the host keeps: 16 GiB
    assert {s.memory_mib for s in shares} == {(512 * 1024 - reserve) // 4}


def test_gpus_on_the_second_socket_first_still_get_its_cores() -> None:
    shares = split("auto", "0", [(4, 5), (6, 7), (0, 1), (2, 3)], TWO_SOCKETS)
    assert [s.numa for s in shares] == [1, 1, 0, 0]
    assert shares[0].cpuset == tuple(range(16, 24)) and shares[2].cpuset == tuple(range(0, 8))
    assert {s.memory_mib for s in shares} == {None}


def test_a_cpu_lab_keeps_each_node_on_one_numa_node() -> None:
    shares = split("auto", "auto", [()] * 4, TWO_SOCKETS)
    assert [s.numa for s in shares] == [0, 1, 0, 1]
    assert sorted(c for s in shares for c in s.cpuset) == list(range(32))


def test_fewer_cpus_than_nodes_gives_quotas_that_add_up_to_at_most_the_host() -> None:
    two = HostFacts(cpus=(0, 1), numa_cpus={0: (0, 1)}, memory_mib=24 * 1024)
    shares = split("auto", "auto", [()] * 4, two)
    assert [(s.cpuset, s.quota) for s in shares] == [((), 0.5)] * 4
    three = split("auto", "auto", [()] * 3, two)
    assert {s.quota for s in three} == {0.66} and sum(s.quota for s in three) <= 2
    assert {s.memory_mib for s in shares} == {(24 * 1024 - int(24 * 1024 * 0.1)) // 4}


def test_explicit_shares_and_what_is_too_much() -> None:
    two = HostFacts(cpus=(0, 1), numa_cpus={0: (0, 1)}, memory_mib=24 * 1024)
    assert [s.cpuset for s in split("1", "256m", [()] * 2, two)] == [(0,), (1,)]
    assert {s.memory_mib for s in split("1", "256m", [()] * 2, two)} == {256}
    assert [s.quota for s in split("0.5", "0", [()] * 4, two)] == [0.5] * 4
    with pytest.raises(UserError, match=r"the lab needs 4 CPUs \(4 nodes x 1\) but the host has 2"):
        split("1", "auto", [()] * 4, two)
    with pytest.raises(UserError, match=r"the lab needs 32.0G of memory \(4 nodes x 8g\) but the host has 24.0G"):
        split("0", "8g", [()] * 4, two)
    assert split("0", "0", [()] * 2, two) == [Share(), Share()]


@pytest.mark.parametrize(("value", "message"), [
    ("many", "--cpus-per-node 'many' is not auto, 0, or a number of CPUs"),
    ("-1", "--cpus-per-node '-1' must be a positive number of CPUs"),
])
def test_bad_cpu_choices(value: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        shares.check_cpu_choice(value)


def test_every_node_sees_its_share() -> None:
    two = HostFacts(cpus=(0, 1), numa_cpus={0: (0, 1)}, memory_mib=24 * 1024)
    lab = plan(Topology(nodes=4, memory_per_node="1g"), [], two)
    env = lab.node("worker1").env
    assert (env["TFLAB_NUM_CPUS"], env["OMP_NUM_THREADS"], env["TF_NUM_INTRAOP_THREADS"]) == ("1", "1", "1")
    assert env["TF_NUM_INTEROP_THREADS"] == "2" and env["TFLAB_MEMORY_MB"] == "1024"
    shared = plan(Topology(nodes=2, cpus_per_node="0", memory_per_node="0"), [], two).node("worker0").env
    assert shared["TFLAB_NUM_CPUS"] == "2" and "OMP_NUM_THREADS" not in shared and "TFLAB_MEMORY_MB" not in shared


TOPO = (
    "\x1b[4m\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tPXB\t0-55,112-167\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tSYS\t56-111,168-223\t1\t\tN/A\n"
    "NIC0\tPXB\tSYS\t X \t\t\t\t\n\nLegend:\n\n  X    = Self\n"
)


def test_nvidia_smi_topology_and_bus_ids_are_read() -> None:
    assert parse_topo_numa(TOPO) == {0: 0, 1: 1}
    assert parse_topo_numa("GPU0\t X \t0-7\tN/A\n") == {}
    assert sysfs_bus_id("00000000:18:00.0") == "0000:18:00.0" and sysfs_bus_id("00000000:AB:00.0") == "0000:ab:00.0"


def fake_sysfs(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A two-socket host of 32 CPUs and 512 GiB, as its sysfs and /proc/meminfo tell it."""
    (root / "devices" / "system" / "cpu").mkdir(parents=True)
    (root / "devices" / "system" / "cpu" / "online").write_text("0-31\n")
    for node, cpus in ((0, "0-15"), (1, "16-31")):
        folder = root / "devices" / "system" / "node" / f"node{node}"
        folder.mkdir(parents=True)
        (folder / "cpulist").write_text(cpus + "\n")
    meminfo = root / "meminfo"
    meminfo.write_text(f"MemTotal:       {512 * 1024 * 1024} kB\nMemFree:        1 kB\n")
    monkeypatch.setattr(hardware, "SYSFS", root)
    monkeypatch.setattr(hardware, "MEMINFO", meminfo)


def test_gen_splits_an_8_gpu_two_socket_server_into_four_machines(runner, fake_nvidia_smi, tmp_path: Path,
                                                                  monkeypatch) -> None:
    fake_sysfs(tmp_path / "sys", monkeypatch)
    monkeypatch.setattr("tflab.host.ports.port_free", lambda host, port: True)
    lab = tmp_path / "lab"
    result = runner.invoke(cli, ["gen", "--lab", str(lab), "--nodes", "4", "--gpus-per-node", "2"])
    assert result.exit_code == 0, result.stderr
    rows = {line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
            for line in result.stdout.splitlines() if line.startswith("│")}
    assert [rows[n][1:4] for n in ("ps0", "worker0", "worker1", "worker2")] == [
        ["0,1", "0-7", "124.0G"], ["2,3", "8-15", "124.0G"], ["4,5", "16-23", "124.0G"], ["6,7", "24-31", "124.0G"]]
    assert "  worker1    CPUs 16-23 (NUMA 1); 124.0G of memory" in result.stdout
    compose = yaml.safe_load((lab / "docker-compose.yml").read_text())["services"]
    assert [(compose[n]["cpuset"], compose[n]["mem_limit"], compose[n]["memswap_limit"])
            for n in ("ps0", "worker0", "worker1", "worker2")] == [
        ("0-7", "126976m", "126976m"), ("8-15", "126976m", "126976m"), ("16-23", "126976m", "126976m"),
        ("24-31", "126976m", "126976m")]
    saved = yaml.safe_load((lab / "tflab.yaml").read_text())
    assert saved["host"]["numa"] == {"0": "0-15", "1": "16-31"} and saved["host"]["gpu_numa"]["5"] == 1
    assert saved["topology"]["cpus_per_node"] == "auto"


def test_the_split_reaches_the_stack_file_and_the_manifests(tmp_path: Path) -> None:
    from tflab.plan import config as cfg
    from tflab.plan.gpus import Gpu

    config = cfg.LabConfig(name="m", topology=Topology(nodes=4, gpus_per_node=2, bind="0.0.0.0"), gpus=tuple(Gpu(i) for i in range(8)),
                           host=TWO_SOCKETS, target="swarm")
    lab = plan(config.topology, config.gpus, config.host)
    stack = yaml.safe_load(templates.stack_file(lab, config, tmp_path, "img:1", ("k", "p")))
    assert stack["services"]["worker1"]["deploy"]["resources"] == {"limits": {"cpus": "8", "memory": "126976m"}}
    job = k8s.tfjob(config, lab, "img:1", cfg.Task("train", "python t.py"), "runs")
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"] == {"requests": {"cpu": "8", "memory": "126976Mi"},
                                   "limits": {"cpu": "8", "memory": "126976Mi", "nvidia.com/gpu": 2}}
    assert k8s.problems_of(job) == []
    quota = plan(Topology(nodes=4, cpus_per_node="0.5"), [], HostFacts(cpus=(0, 1), memory_mib=4096))
    jobset = k8s.jobset(cfg.LabConfig(name="q", topology=quota.topology), quota, "img:1",
                        cfg.Task("train", "python t.py"), "runs")
    pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert pod["resources"]["limits"]["cpu"] == "500m" and k8s.problems_of(jobset) == []


def test_an_even_share_too_small_to_set_is_refused_not_dropped() -> None:
    # issue 30.10: 201 nodes on 2 CPUs got no CPU limit at all; 5000 nodes got 4m of memory
    from tflab.errors import UserError
    from tflab.plan import shares as m

    small = m.HostFacts(cpus=(0, 1), numa_cpus={0: (0, 1)}, memory_mib=24 * 1024)
    assert m.split("auto", "auto", [()] * 200, small)[0].quota == 0.01
    with pytest.raises(UserError, match=r"2 CPUs over 201 nodes give each less than 0.01 CPU.*--cpus-per-node 0"):
        m.split("auto", "auto", [()] * 201, small)
    assert m.split("0", "auto", [()] * 201, small)[0].quota is None, "shared CPUs, as asked"
    with pytest.raises(UserError, match=r"over 4096 nodes gives each 5M, less than a node needs \(64M\)"):
        m.split("0", "auto", [()] * 4096, small)
