"""`tflab graph`: the lab's topology as Mermaid text and as a picture (PNG, SVG), from the lab's own plan."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import cli

from tflab.host import labfiles
from tflab.render import graph


def gen(runner, root: Path, *options: str) -> Path:
    made = runner.invoke(cli, ["gen", "--lab", str(root), "--ssh-port-base", "32022", "--tensorboard-port-base",
                               "32122", "--cpus-per-node", "0", "--memory-per-node", "0", *options])
    assert made.exit_code == 0, made.stderr
    return root


def test_mermaid_names_every_node_what_it_owns_the_links_and_who_talks_to_whom(runner, tmp_path: Path,
                                                                                 fake_nvidia_smi) -> None:
    lab = gen(runner, tmp_path / "lab", "--nodes", "3", "--gpus-per-node", "2", "--link-rate", "100mbit",
              "--link-delay", "5", "--name", "demo")
    shown = runner.invoke(cli, ["graph", "--lab", str(lab)])
    assert shown.exit_code == 0, shown.stderr
    assert shown.stdout.splitlines()[:6] == [
        "flowchart TB",
        '  subgraph lab["demo: lab network: 100mbit, 5 ms delay on every node\'s link, both ways"]',
        '    ps0["<b>ps0</b><br/>ps<br/>GPUs 0,1<br/>CPUs shared<br/>memory -<br/>SSH 127.0.0.1:32022"]:::ps',
        '    worker0["<b>worker0</b><br/>worker (chief)<br/>GPUs 2,3<br/>CPUs shared<br/>memory -<br/>SSH '
        '127.0.0.1:32023"]:::worker',
        '    worker1["<b>worker1</b><br/>worker<br/>GPUs 4,5<br/>CPUs shared<br/>memory -<br/>SSH 127.0.0.1:32024"]:::worker',
        "  end",
    ]
    assert "  worker0 --> ps0" in shown.stdout and "  worker1 --> ps0" in shown.stdout


def test_an_all_reduce_lab_is_a_ring_and_a_swarm_lab_groups_its_nodes_by_host(runner, tmp_path: Path) -> None:
    ring = labfiles.open_lab(gen(runner, tmp_path / "ring", "--nodes", "3", "--ps", "0"))
    assert graph.edges(ring.lab) == [("worker0", "worker1"), ("worker1", "worker2"), ("worker2", "worker0")]
    assert "worker0 <--> worker1" in graph.mermaid(ring.lab, ring.config)
    swarm = labfiles.open_lab(gen(runner, tmp_path / "swarm", "--nodes", "3", "--target", "swarm", "--bind", "0.0.0.0",
                                  "--place", "ps0=a", "--place", "worker0=b", "--place", "worker1=b"))
    text = graph.mermaid(swarm.lab, swarm.config)
    assert '    subgraph host_a["host a"]' in text and '    subgraph host_b["host b"]' in text
    assert text.index("host_b") < text.index('worker1["') and text.index('ps0["') < text.index("host_b")


@pytest.mark.parametrize("suffix", [".png", ".svg", ".mmd"])
def test_a_picture_or_mermaid_is_written_by_the_files_extension(runner, tmp_path: Path, suffix: str) -> None:
    lab = gen(runner, tmp_path / "lab", "--nodes", "4", "--chief")
    out = tmp_path / f"topology{suffix}"
    done = runner.invoke(cli, ["graph", "--lab", str(lab), "-o", str(out)])
    assert done.exit_code == 0, done.stderr
    data = out.read_bytes()
    if suffix == ".png":
        import matplotlib.image

        pixels = matplotlib.image.imread(out)
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and pixels.std() > 0.05, "a picture, not a blank page"
    elif suffix == ".svg":
        assert b"<svg" in data and all(name.encode() in data for name in ("ps0", "worker0", "chief"))
    else:
        assert data.decode().startswith("flowchart TB")


def test_a_file_of_no_picture_kind_is_one_line_and_exit_2(runner, tmp_path: Path) -> None:
    lab = gen(runner, tmp_path / "lab", "--nodes", "2")
    done = runner.invoke(cli, ["graph", "--lab", str(lab), "-o", str(tmp_path / "topology.txt")])
    assert done.exit_code == 2
    assert done.stderr == (f"tflab: error: -o {tmp_path / 'topology.txt'}: write a picture (.png, .svg) or Mermaid "
                           "(.mmd), not .txt\n")
