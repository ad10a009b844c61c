"""Which Keras a program written for Keras 2 gets: it asks for it itself before importing TensorFlow, as TensorFlow
2.16's release notes tell such programs to (tflab's own probe, beside the corpus: tests/test_docker_programs.py).

It prints the Keras of both ways programs reach it: `tf.keras` (looked up when first used) and
`from tensorflow.keras import layers` (found where TensorFlow's import put `tensorflow.keras`): a cold
`python` gives tf_keras to both; an interpreter that imported TensorFlow before this program ran would give
the second Keras 3.
"""

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402
from tensorflow.keras import layers  # noqa: E402

print("%s: tf.keras is %s, tensorflow.keras.layers is %s" % (
    os.environ.get("TFLAB_NODE", "here"), type(tf.keras.layers.Dense(1)).__module__.split(".")[0],
    layers.Dense.__module__.split(".")[0]))
