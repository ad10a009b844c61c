"""TF2's ParameterServerStrategy: the modern path beside mnist_async.py's classic one.

Run in a lab made with `--chief`. The parameter servers and workers only serve
(tf.distribute.Server.join); the coordinator on `chief` creates the variables on the
parameter servers and schedules training steps on the workers. Without a chief this
strategy stalls, which is why tflab adds one.

It tolerates a lost worker, as TensorFlow's parameter-server training tutorial describes:
the coordinator runs the lost worker's steps on the others and takes the worker back when it
returns (`tflab run ps_strategy --fault "kill worker1 at step 50 then restart" --expect
survive`). A lost parameter server is not recoverable without restarting the coordinator.
"""

from __future__ import annotations

import argparse
import logging
import os
import time

# Every task, before TensorFlow starts: a call to a lost task fails fast and is handled by the
# coordinator (the tutorial's setting), instead of waiting on the lost task.
os.environ["GRPC_FAIL_FAST"] = "use_caller"

import tensorflow as tf  # noqa: E402

from tflab_example import Mlp, limit_gpu_memory, load_dataset


def serve(resolver: tf.distribute.cluster_resolver.TFConfigClusterResolver) -> None:
    """A parameter server or worker: serve until tflab stops us."""
    server = tf.distribute.Server(
        resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc", start=True,
    )
    print(f"{resolver.task_type}{resolver.task_id}: serving for the coordinator", flush=True)
    server.join()


def show_recovery() -> None:
    """Let the coordinator say when it loses a worker and gets it back (its INFO lines), and nothing else of INFO."""

    class CoordinatorOnly(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return record.levelno >= logging.WARNING or record.pathname.endswith("cluster_coordinator.py")

    logger = tf.get_logger()
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:tensorflow:%(message)s"))
    handler.addFilter(CoordinatorOnly())
    logger.handlers = [handler]
    logger.propagate = False  # one handler of ours: TensorFlow's own would print every INFO line
    logger.setLevel(logging.INFO)


def coordinate(resolver, args: argparse.Namespace) -> None:
    """The chief: variables on the ps, steps scheduled on the workers."""
    show_recovery()
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
        if step % 25 == 0:
            try:
                loss = float(result.fetch())  # this step's loss (the others keep running meanwhile)
            except (tf.errors.UnavailableError, tf.errors.CancelledError):
                # The step ran on a worker lost before its loss was copied here (TensorFlow keeps a result on
                # the worker that made it): the loss is gone with the worker; the coordinator carries on.
                print(f"chief: step {step}: its worker was lost before its loss was read", flush=True)
                continue
            print(f"chief: step {step} loss {loss:.4f} ({step / (time.time() - started):.1f} steps/s)", flush=True)
    coordinator.join()
    print(f"chief: test accuracy {model.accuracy(data['x_test'], data['y_test']):.4f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default=os.environ.get("TFLAB_DATA_DIR", "/data"))
    parser.add_argument("--steps", type=int, default=2000)
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
