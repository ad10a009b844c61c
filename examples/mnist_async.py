"""Asynchronous between-graph training with a parameter server, the classic way.

Written with flags and tf.compat.v1 as the well-known distributed-TensorFlow tutorials do,
on TensorFlow 2.x. Run on every node (tflab fills the flags):

    python mnist_async.py --job_name=worker --task_index=0 --ps_hosts=ps0:2222 \
        --worker_hosts=worker0:2222,worker1:2222,worker2:2222

The parameter servers hold the variables and serve forever (tflab stops them when the
workers are done); every worker trains asynchronously; worker 0 is the chief: it
initialises, writes checkpoints and summaries, and reports the test accuracy.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import tensorflow as tf

from tflab_example import limit_gpu_memory, load_dataset, run_dir


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job_name", required=True, choices=["ps", "worker"])
    parser.add_argument("--task_index", type=int, required=True)
    parser.add_argument("--ps_hosts", required=True)
    parser.add_argument("--worker_hosts", required=True)
    parser.add_argument("--data_dir", default=os.environ.get("TFLAB_DATA_DIR", "/data"))
    parser.add_argument("--log_dir", default=run_dir("/runs/train"))
    parser.add_argument("--train_steps", type=int, default=1500)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=0.01)
    parser.add_argument("--hidden_units", type=int, default=128)
    return parser.parse_args()


def build_model(features: int, hidden: int, learning_rate: float):
    """The graph: an MLP whose variables live on the parameter servers."""
    x = tf.compat.v1.placeholder(tf.float32, [None, features], name="x")
    y = tf.compat.v1.placeholder(tf.int64, [None], name="y")
    w1 = tf.compat.v1.get_variable("w1", [features, hidden], initializer=tf.compat.v1.glorot_uniform_initializer())
    b1 = tf.compat.v1.get_variable("b1", [hidden], initializer=tf.compat.v1.zeros_initializer())
    w2 = tf.compat.v1.get_variable("w2", [hidden, 10], initializer=tf.compat.v1.glorot_uniform_initializer())
    b2 = tf.compat.v1.get_variable("b2", [10], initializer=tf.compat.v1.zeros_initializer())
    logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.AdamOptimizer(learning_rate).minimize(loss, global_step=global_step)
    tf.compat.v1.summary.scalar("loss", loss)
    tf.compat.v1.summary.scalar("accuracy", accuracy)
    return x, y, loss, accuracy, global_step, train_op


def wait_for_chief(target: str, config, uninitialized) -> None:
    """Wait for the chief to initialise the variables (MonitoredTrainingSession polls every 30 s)."""
    with tf.compat.v1.Session(target, config=config) as session:
        while session.run(uninitialized).size:
            time.sleep(0.5)


def main() -> None:
    args = parse_args()
    # TF1's hooks warn whenever another worker moved the global step first: normal when training
    # asynchronously, and it would drown the output.
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    tf.compat.v1.disable_eager_execution()
    limit_gpu_memory(tf)
    ps_hosts, worker_hosts = args.ps_hosts.split(","), args.worker_hosts.split(",")
    cluster = tf.train.ClusterSpec({"ps": ps_hosts, "worker": worker_hosts})
    server = tf.distribute.Server(cluster, job_name=args.job_name, task_index=args.task_index)
    name = f"{args.job_name}{args.task_index}"

    if args.job_name == "ps":
        print(f"{name}: serving the model's variables on {ps_hosts[args.task_index]}", flush=True)
        server.join()  # never returns: tflab stops the parameter servers when the workers end
        return

    is_chief = args.task_index == 0
    data = load_dataset(args.data_dir)
    device = tf.compat.v1.train.replica_device_setter(
        worker_device=f"/job:worker/task:{args.task_index}", cluster=cluster
    )
    with tf.compat.v1.device(device):
        x, y, loss, accuracy, global_step, train_op = build_model(
            data["x_train"].shape[1], args.hidden_units, args.learning_rate
        )
        uninitialized = None if is_chief else tf.compat.v1.report_uninitialized_variables()
    # Talk to the parameter servers and to ourselves only: a worker that has finished
    # must not hold the others up.
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{args.task_index}"])
    if not is_chief:
        wait_for_chief(server.target, config, uninitialized)

    if is_chief:
        latest = tf.train.latest_checkpoint(args.log_dir)
        print(f"{name}: " + (f"resuming from {latest}" if latest else f"starting fresh in {args.log_dir}"), flush=True)
    rng = np.random.default_rng(args.task_index)
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=args.train_steps)]
    started, local_steps, step = time.time(), 0, 0
    with tf.compat.v1.train.MonitoredTrainingSession(
        master=server.target, is_chief=is_chief, checkpoint_dir=args.log_dir, hooks=hooks,
        config=config, save_checkpoint_steps=500, save_checkpoint_secs=None,
        save_summaries_steps=25, log_step_count_steps=100,
    ) as session:
        while not session.should_stop():
            batch = rng.integers(0, len(data["x_train"]), args.batch_size)
            _, step, batch_loss = session.run(
                [train_op, global_step, loss], {x: data["x_train"][batch], y: data["y_train"][batch]}
            )
            local_steps += 1
            if local_steps == 1:
                print(f"{name}: first step done (global step {step})", flush=True)
            if local_steps % 100 == 0:
                rate = local_steps / (time.time() - started)
                # The chief measures the model on the test set as it goes: tflab reads a run's time to an accuracy.
                quality = (f" accuracy {session.run(accuracy, {x: data['x_test'], y: data['y_test']}):.4f}"
                           if is_chief and not session.should_stop() else "")
                print(f"{name}: global step {step} (its own step {local_steps}) loss {batch_loss:.4f}{quality} "
                      f"({rate:.1f} steps/s here)", flush=True)
    print(f"{name}: done after {local_steps} local steps (global step {step})", flush=True)

    if is_chief:
        with tf.compat.v1.Session(server.target, config=config) as session:
            test_accuracy = session.run(accuracy, {x: data["x_test"], y: data["y_test"]})
        writer = tf.compat.v1.summary.FileWriter(os.path.join(args.log_dir, "eval"))
        summary = tf.compat.v1.Summary(value=[tf.compat.v1.Summary.Value(tag="test_accuracy", simple_value=test_accuracy)])
        writer.add_summary(summary, step)
        writer.close()
        print(f"{name}: test accuracy {test_accuracy:.4f}", flush=True)


if __name__ == "__main__":
    main()
