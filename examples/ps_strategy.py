"""TF2's ParameterServerStrategy: the modern path beside mnist_async.py's classic one.

Run in a lab made with `--chief`. The parameter servers and workers only serve
(tf.distribute.Server.join); the coordinator on `chief` creates the variables on the
parameter servers and schedules training steps on the workers. Without a chief this
strategy stalls, which is why tflab adds one.
"""

from __future__ import annotations

import argparse
import os
import time

import tensorflow as tf

from tflab_example import Mlp, limit_gpu_memory, load_dataset


def serve(resolver: tf.distribute.cluster_resolver.TFConfigClusterResolver) -> None:
    """A parameter server or worker: serve until tflab stops us."""
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc", start=True,
    )
    print(f"{resolver.task_type}{resolver.task_id}: serving for the coordinator", flush=True)
    server.join()


def coordinate(resolver, args: argparse.Namespace) -> None:
    """The chief: variables on the ps, steps scheduled on the workers."""
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    data = load_dataset(args.data_dir)
    with strategy.scope():
        model = Mlp(tf, data["x_train"].shape[1])

    def dataset_fn(_context=None) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices((data["x_train"], data["y_train"]))
        return ds.shuffle(2048).repeat().batch(args.batch_size)

    with strategy.scope():
        per_worker = coordinator.create_per_worker_dataset(dataset_fn)
    iterator = iter(per_worker)

    @tf.function
    def step_fn(it):
        x, y = next(it)
        return strategy.run(lambda a, b: model.sgd_step(a, b, args.learning_rate), args=(x, y))

    started = time.time()
    for step in range(1, args.steps + 1):
        result = coordinator.schedule(step_fn, args=(iterator,))
        if step % 100 == 0:
            coordinator.join()
            loss = float(result.fetch())
            print(f"chief: step {step} loss {loss:.4f} ({step / (time.time() - started):.1f} steps/s)", flush=True)
    coordinator.join()
    print(f"chief: test accuracy {model.accuracy(data['x_test'], data['y_test']):.4f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default="/data")
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=0.3)
    args = parser.parse_args()
    limit_gpu_memory(tf)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if "chief" not in resolver.cluster_spec().as_dict():
        raise SystemExit("ParameterServerStrategy needs a coordinator: make the lab with `tflab gen --chief`")
    if resolver.task_type in ("ps", "worker"):
        serve(resolver)
    else:
        coordinate(resolver, args)


if __name__ == "__main__":
    main()
