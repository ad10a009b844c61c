"""A traceback's pages of tensor values, cut on the terminal to its message (real output: Keras 3's PerReplica error
as a worker of tests/corpus printed it in a lab; Keras 3's restore error)."""

from __future__ import annotations

from conftest import FIXTURES

from tflab.plan.tensordump import TensorCut


def shown(lines: list[str]) -> list[str]:
    cut = TensorCut()
    out = [line for each in lines for line in cut.show(each)]
    return out + cut.end()


def test_keras_3s_per_replica_error_keeps_its_message_and_leaves_the_values_out() -> None:
    lines = (FIXTURES / "output" / "keras3-per-replica.log").read_text().splitlines()
    out = shown(lines)
    start = lines.index("ValueError: Attempt to convert a value (PerReplica:{")
    assert out[:start + 1] == lines[:start + 1], "everything before the dump, as it was"
    assert out[start + 1:] == [
        f"... ({len(lines) - start - 2} lines of tensor values left out here: the node's log keeps them)",
        "}) with an unsupported type (<class 'tensorflow.python.distribute.values.PerReplica'>) to a Tensor."]


def test_a_restore_errors_values_are_left_out_and_what_follows_is_shown() -> None:
    lines = [
        "The shape of the target variable and the shape of the target value in `variable.assign(value)` must match. "
        "variable.shape=(8, 20), Received: value.shape=(8, 10). Target variable: <Variable path=sequential/dense/kernel,"
        " shape=(8, 20), dtype=float32, value=[[ 0.01466414 -0.42980456 -0.3970804   0.1895",
        "   0.30864358 -0.32494175 -0.22555318 -0.14734086  0.4393084  -0.11147544",
        "  -0.36210662  0.35983646]",
        " [ 0.05786395 -0.21758816 -0.45638332  0.1483773   0.09319752  0.43959337",
        "   0.41353613  0.32925344]]>",
        "",
        "List of objects that could not be loaded:",
        "[<Dense name=dense, built=True>]",
    ]
    assert shown(lines) == [lines[0], "... (5 lines of tensor values left out here: the node's log keeps them)",
                            "List of objects that could not be loaded:", "[<Dense name=dense, built=True>]"]


def test_ordinary_output_is_never_cut() -> None:
    lines = ["Epoch 1/3", "20/20 - 4s - loss: 0.6911 - 4s/epoch - 213ms/step", "[1, 2, 3]", "", "0.5",
             "worker0: test accuracy 0.9833"]
    assert shown(lines) == lines
