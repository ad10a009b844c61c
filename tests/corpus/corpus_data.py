"""MNIST for the corpus, without a download: the lab's digits (scikit-learn's, in /data) as 28x28 images.

No node reaches the internet, where `tf.keras.datasets.mnist.load_data()` and `tfds.load("mnist")`
fetch MNIST. Each corpus program's one changed line calls `load_data()` here instead: the same
arrays as Keras gives, as many (60,000 uint8 images of 28x28 in [0, 255] for training, 10,000 for
testing, integer labels: a program that counts its steps on MNIST's size finds them), made from the
8x8 digits the lab keeps in /data (1,437 for training, 360 for testing, each taken again as often as
it takes), each pixel three pixels wide with a border of two, as MNIST centres its digits. A real
MNIST (Keras' mnist.npz) in the lab's data folder is used as it is.
"""

import os

import numpy as np

DATA_DIR = os.environ.get("TFLAB_DATA_DIR", "/data")


def _as_mnist(images):
    """8x8 digits (0..16) as 28x28 uint8 images (0..255), centred as MNIST's are."""
    big = np.kron(images.astype(np.float32) * (255.0 / 16.0), np.ones((3, 3), dtype=np.float32))
    return np.pad(big, ((0, 0), (2, 2), (2, 2))).round().astype(np.uint8)


MNIST_SIZES = {"train": 60000, "test": 10000}


def _sized(images, labels, count):
    """`count` examples: the digits taken again in turn as often as it needs."""
    order = np.arange(count) % len(labels)
    return _as_mnist(images)[order], labels.astype(np.uint8)[order]


def load_data():
    """((x_train, y_train), (x_test, y_test)) as `tf.keras.datasets.mnist.load_data()` returns them."""
    mnist = os.path.join(DATA_DIR, "mnist.npz")
    if os.path.isfile(mnist):
        with np.load(mnist) as data:
            return (data["x_train"], data["y_train"]), (data["x_test"], data["y_test"])
    with np.load(os.path.join(DATA_DIR, "digits.npz")) as data:
        return (_sized(data["x_train"], data["y_train"], MNIST_SIZES["train"]),
                _sized(data["x_test"], data["y_test"], MNIST_SIZES["test"]))
