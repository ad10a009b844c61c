"""GPU discovery (nvidia-smi) and explicit --gpus lists."""

from __future__ import annotations

from pathlib import Path

import pytest

from tflab.errors import CommandError, UserError
from tflab.host import proc
from tflab.host.hardware import discover
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
