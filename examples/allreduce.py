"""Synchronous all-reduce training with MultiWorkerMirroredStrategy, from TF_CONFIG alone.

Run in a lab made with `--ps 0` (every node a worker). Each step every worker computes
gradients on its shard and the update is all-reduced, so all workers hold the same model
and report the same loss. Keras 3's `fit` does not work under this strategy (TF 2.16+),
so this is a custom loop over plain variables.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import tensorflow as tf

from tflab_example import Mlp, limit_gpu_memory, load_dataset, run_dir


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default="/data")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch_size_per_replica", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=0.5)
    parser.add_argument("--hidden_units", type=int, default=128)
    args = parser.parse_args()

    cluster = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {})
    if cluster.get("ps"):
        raise SystemExit("allreduce needs a lab without parameter servers: `tflab gen --ps 0`")
    limit_gpu_memory(tf)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    me = os.environ.get("TFLAB_NODE", "worker")
    data = load_dataset(args.data_dir)
    replicas = strategy.num_replicas_in_sync
    global_batch_size = args.batch_size_per_replica * replicas
    print(f"{me}: {replicas} replicas in sync", flush=True)

    def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
        batch = context.get_per_replica_batch_size(global_batch_size)
        ds = tf.data.Dataset.from_tensor_slices((data["x_train"], data["y_train"]))
        ds = ds.shard(context.num_input_pipelines, context.input_pipeline_id)
        return ds.shuffle(2048, seed=context.input_pipeline_id).repeat().batch(batch, drop_remainder=True)

    with strategy.scope():
        model = Mlp(tf, data["x_train"].shape[1], hidden=args.hidden_units)
    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))

    @tf.function
    def train_step(batch):
        losses = strategy.run(lambda x, y: model.sgd_step(x, y, args.learning_rate), args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

    writer = tf.summary.create_file_writer(os.path.join(run_dir("/runs/allreduce"), me))
    started = time.time()
    for step in range(1, args.steps + 1):
        loss = float(train_step(next(iterator)))
        if step % 50 == 0:
            print(f"{me}: step {step} loss {loss:.6f} ({step / (time.time() - started):.1f} steps/s)", flush=True)
            with writer.as_default():
                tf.summary.scalar("loss", loss, step=step)
    accuracy = model.accuracy(data["x_test"], data["y_test"])
    print(f"{me}: final loss {loss:.6f} test accuracy {accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
