"""An honest program that is slow to start: it prepares its data for a while (computing, printing nothing), then
trains and prints its steps (tests/test_docker_programs.py: never called stalled)."""

import os
import time

import tensorflow as tf

seconds = float(os.environ.get("PREPARE_S", "20"))
began = time.monotonic()
while time.monotonic() - began < seconds:
    sum(i * i for i in range(10000))  # a data loader decoding, parsing, shuffling
strategy = tf.distribute.MultiWorkerMirroredStrategy()
with strategy.scope():
    total = tf.Variable(0.0)
for step in range(1, 4):
    strategy.run(lambda: total.assign_add(1.0))
    print("step %d" % step, flush=True)
