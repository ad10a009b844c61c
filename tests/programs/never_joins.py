"""An all-reduce program whose second worker never joins: it waits for something before it makes its strategy (a
lock, a file, a peer of its own), using no CPU and printing nothing. The first worker makes its strategy and waits
for it: a stalled run, as a cluster's would be (tests/test_docker_programs.py)."""

import os
import time

import tensorflow as tf

if os.environ["TFLAB_TASK_INDEX"] == "1":
    time.sleep(3600)
strategy = tf.distribute.MultiWorkerMirroredStrategy()
print("joined", flush=True)
