"""GPU discovery (nvidia-smi) and explicit --gpus lists."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tflab.errors import CommandError, UserError
from tflab.host import proc
from tflab.host.hardware import discover, gpu_numa
from tflab.plan.gpus import Gpu, parse_gpu_list, parse_nvidia_smi


def test_parses_the_fake_eight_gpu_host(fake_nvidia_smi: Path) -> None:
    gpus = discover(proc.run)
    assert [g.index for g in gpus] == list(range(8))
    assert gpus[0] == Gpu(0, "GPU-5f3c1d2a-8e4b-4c61-9d2f-0a1b2c3d4e50", "NVIDIA H100 80GB HBM3", 81559)


def test_no_nvidia_smi_means_no_gpus(no_nvidia_smi: None) -> None:
    assert discover(proc.run) == []


def test_a_broken_driver_means_no_gpus() -> None:
    def broken(argv, **_kw):
        raise CommandError(list(argv), 9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver")

    assert discover(broken) == []


def test_unreadable_output_is_a_clear_error() -> None:
    with pytest.raises(UserError, match="cannot read this line"):
        parse_nvidia_smi("garbage line\n")


@pytest.mark.parametrize(
    ("spec", "indices"),
    [("0-7", list(range(8))), ("0,1,4,5", [0, 1, 4, 5]), ("0-1,6", [0, 1, 6]), (" 3 ", [3])],
)
def test_gpu_lists(spec: str, indices: list[int]) -> None:
    assert [g.index for g in parse_gpu_list(spec)] == indices


@pytest.mark.parametrize(("spec", "message"), [
    ("0-", "is not a GPU list"), ("a,b", "is not a GPU list"), ("", "is not a GPU list"),
    ("5-2", "runs backwards"), ("0,0", "lists a GPU twice"),
])
def test_bad_gpu_lists(spec: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_gpu_list(spec)


REAL_H200 = Path(__file__).parent / "fixtures" / "nvidia-smi-h200"  # nvidia-smi 580.159.04 on a real H200 host


def test_a_real_h200_hosts_nvidia_smi_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What a real nvidia-smi printed (driver 580.159.04, one H200; captured on this project's lent GPU
    machine): its listing, its topology (with the terminal escapes it writes even into a file) and the use
    and memory the guard samples; sysfs there says NUMA node -1, the topology 0."""
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\n"
                    f'case "$*" in\n'
                    f'  *uuid*) cat "{REAL_H200}/query.csv" ;;\n'
                    f'  *"topo -m"*) cat "{REAL_H200}/topo.txt" ;;\n'
                    f'  *pci.bus_id*) cat "{REAL_H200}/bus.csv" ;;\n'
                    f'  *utilization*) cat "{REAL_H200}/util.csv" ;;\n'
                    f'  *) cat "{REAL_H200}/table.txt" ;;\n'
                    "esac\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert "\x1b[4m" in (REAL_H200 / "topo.txt").read_text(), "the real header is underlined"
    gpus = discover(proc.run)
    assert gpus == [Gpu(0, "GPU-c5a16fcb-f8b2-6bf0-eebf-088ae96fb442", "NVIDIA H200", 143771)]
    assert gpu_numa(proc.run, gpus) == {0: 0}
    from tflab_guard import metrics

    assert metrics.gpu_sample() == [[0, 0.0, 0.0, 143771.0]]
