"""What the examples share: the data (digits or real MNIST), a small model, GPU memory shares.

Every example runs unchanged on a CPU lab and on GPUs.
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np

DATA_DIR = os.environ.get("TFLAB_DATA_DIR", "/data")
MNIST_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


def _read_idx(path: Path) -> np.ndarray:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as handle:
        _zero, dtype, dims = struct.unpack(">HBB", handle.read(4))
        shape = struct.unpack(">" + "I" * dims, handle.read(4 * dims))
        return np.frombuffer(handle.read(), dtype=np.uint8).reshape(shape)


def _find(folder: Path, name: str) -> Path | None:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def load_dataset(data_dir: str = DATA_DIR) -> dict[str, np.ndarray]:
    """x_train, y_train, x_test, y_test as float32 features in [0, 1] and int64 labels.

    Real MNIST is used when its files are in the data folder (the four idx files, plain or
    gzipped, or Keras' mnist.npz); otherwise scikit-learn's digits, prepared into digits.npz
    on the host by prepare_data.py.
    """
    folder = Path(data_dir)
    found = {key: _find(folder, name) for key, name in MNIST_FILES.items()}
    if all(found.values()):
        arrays = {key: _read_idx(path) for key, path in found.items()}
        name = "MNIST"
    elif (folder / "mnist.npz").is_file():
        with np.load(folder / "mnist.npz") as npz:
            arrays = {key: npz[key] for key in MNIST_FILES}
        name = "MNIST"
    elif (folder / "digits.npz").is_file():
        with np.load(folder / "digits.npz") as npz:
            arrays = {key: npz[key] for key in MNIST_FILES}
        name = "digits"
    else:
        raise SystemExit(
            f"no data in {folder}: run `python examples/prepare_data.py DATA_DIR` on the host, "
            "or put the MNIST idx files there"
        )
    scale = 16.0 if name == "digits" else 255.0
    out = {
        "x_train": arrays["x_train"].reshape(len(arrays["x_train"]), -1).astype(np.float32) / scale,
        "x_test": arrays["x_test"].reshape(len(arrays["x_test"]), -1).astype(np.float32) / scale,
        "y_train": arrays["y_train"].astype(np.int64),
        "y_test": arrays["y_test"].astype(np.int64),
    }
    print(f"data: {name}, {len(out['x_train'])} training and {len(out['x_test'])} test examples "
          f"of {out['x_train'].shape[1]} features", flush=True)
    return out


def limit_gpu_memory(tf) -> None:
    """Keep to this node's memory share when tflab put several nodes on one GPU."""
    share = os.environ.get("TFLAB_GPU_MEMORY_MB")
    for gpu in tf.config.list_physical_devices("GPU"):
        if share:
            tf.config.set_logical_device_configuration(
                gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=int(share))]
            )
        else:
            tf.config.experimental.set_memory_growth(gpu, True)


def run_dir(default: str = "/runs/local") -> str:
    """Where this run writes checkpoints and summaries (tflab sets TFLAB_RUN_DIR per task)."""
    return os.environ.get("TFLAB_RUN_DIR", default)


class Mlp:
    """A one-hidden-layer perceptron as plain tf.Variables (no Keras: it works under every strategy)."""

    def __init__(self, tf, features: int, hidden: int = 128, classes: int = 10, seed: int = 1) -> None:
        self.tf = tf
        init = tf.random.stateless_normal
        mean = tf.VariableAggregation.MEAN
        self.w1 = tf.Variable(init([features, hidden], seed=[seed, 1]) * (2.0 / features) ** 0.5, aggregation=mean, name="w1")
        self.b1 = tf.Variable(tf.zeros([hidden]), aggregation=mean, name="b1")
        self.w2 = tf.Variable(init([hidden, classes], seed=[seed, 2]) * (1.0 / hidden) ** 0.5, aggregation=mean, name="w2")
        self.b2 = tf.Variable(tf.zeros([classes]), aggregation=mean, name="b2")

    @property
    def variables(self) -> list:
        return [self.w1, self.b1, self.w2, self.b2]

    def __call__(self, x):
        tf = self.tf
        return tf.matmul(tf.nn.relu(tf.matmul(x, self.w1) + self.b1), self.w2) + self.b2

    def loss(self, x, y):
        tf = self.tf
        return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=self(x)))

    def sgd_step(self, x, y, learning_rate: float):
        """One SGD step; under a strategy the MEAN aggregation all-reduces the update."""
        tf = self.tf
        with tf.GradientTape() as tape:
            loss = self.loss(x, y)
        for variable, grad in zip(self.variables, tape.gradient(loss, self.variables)):
            variable.assign_sub(learning_rate * grad)
        return loss

    def accuracy(self, x, y) -> float:
        tf = self.tf
        predictions = tf.argmax(self(tf.constant(x)), axis=1)
        return float(tf.reduce_mean(tf.cast(tf.equal(predictions, tf.constant(y)), tf.float32)))
