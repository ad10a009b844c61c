"""One node on its own: where each op runs, and one model replicated over the node's GPUs.

Prints the device of every op of a small computation, then trains with MirroredStrategy
over every GPU the node owns (its CPU when it has none).
"""

from __future__ import annotations

import os
import time

import tensorflow as tf

from tflab_example import Mlp, limit_gpu_memory, load_dataset


def main() -> None:
    limit_gpu_memory(tf)
    me = os.environ.get("TFLAB_NODE", "node")
    gpus = tf.config.list_logical_devices("GPU")
    print(f"{me}: TFLAB_NUM_GPUS={os.environ.get('TFLAB_NUM_GPUS', '?')}, TensorFlow sees {len(gpus)} GPU(s): "
          f"{[g.name for g in gpus]}", flush=True)

    tf.debugging.set_log_device_placement(True)
    a = tf.random.uniform([256, 256])
    b = tf.linalg.matmul(a, a)
    print(f"{me}: matmul ran on {b.device}", flush=True)
    tf.debugging.set_log_device_placement(False)

    strategy = tf.distribute.MirroredStrategy()
    print(f"{me}: MirroredStrategy over {strategy.num_replicas_in_sync} replica(s): "
          f"{list(strategy.extended.worker_devices)}", flush=True)
    data = load_dataset(os.environ.get("TFLAB_DATA_DIR", "/data"))
    with strategy.scope():
        model = Mlp(tf, data["x_train"].shape[1])
    ds = tf.data.Dataset.from_tensor_slices((data["x_train"], data["y_train"])).shuffle(2048, seed=0)
    iterator = iter(strategy.experimental_distribute_dataset(ds.repeat().batch(64 * strategy.num_replicas_in_sync)))

    @tf.function
    def train_step(batch):
        losses = strategy.run(lambda x, y: model.sgd_step(x, y, 0.5), args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

    started = time.time()
    for step in range(1, 301):
        loss = float(train_step(next(iterator)))
        if step % 100 == 0:
            print(f"{me}: step {step} loss {loss:.4f} ({step / (time.time() - started):.1f} steps/s)", flush=True)
    print(f"{me}: test accuracy {model.accuracy(data['x_test'], data['y_test']):.4f}", flush=True)


if __name__ == "__main__":
    main()
