"""A classic TF1 between-graph program whose non-chief workers ask before the chief is ready.

Written the way the well-known tutorials write it (flags, tf.compat.v1, MonitoredTrainingSession).
The chief waits a few seconds before creating its session, as a chief restoring a large
checkpoint does; the other workers ask first, find the variables uninitialised, and sleep
through MonitoredTrainingSession's 30 s recovery wait. By then the chief has finished.
With --device_filters their sessions need only the ps and themselves, and they end; without,
their sessions wait for the chief's server forever: the seed's "a late worker waits forever".
"""

import argparse
import time

import tensorflow as tf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job_name", required=True)
    parser.add_argument("--task_index", type=int, required=True)
    parser.add_argument("--ps_hosts", required=True)
    parser.add_argument("--worker_hosts", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--chief_delay", type=float, default=8.0)
    parser.add_argument("--device_filters", action="store_true")
    args = parser.parse_args()

    tf.compat.v1.disable_eager_execution()
    cluster = tf.train.ClusterSpec({"ps": args.ps_hosts.split(","), "worker": args.worker_hosts.split(",")})
    server = tf.distribute.Server(cluster, job_name=args.job_name, task_index=args.task_index)
    if args.job_name == "ps":
        server.join()
        return
    name = f"worker{args.task_index}"
    is_chief = args.task_index == 0
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
            worker_device=f"/job:worker/task:{args.task_index}", cluster=cluster)):
        weights = tf.compat.v1.get_variable("w", [10], initializer=tf.compat.v1.zeros_initializer())
        global_step = tf.compat.v1.train.get_or_create_global_step()
        loss = tf.reduce_sum(tf.square(weights - 1.0))
        train_op = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss, global_step=global_step)
    config = None
    if args.device_filters:
        config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", f"/job:worker/task:{args.task_index}"])
    if is_chief:
        time.sleep(args.chief_delay)
    print(f"{name}: creating the session", flush=True)
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=args.steps)]
    with tf.compat.v1.train.MonitoredTrainingSession(master=server.target, is_chief=is_chief, hooks=hooks,
                                                     config=config) as session:
        while not session.should_stop():
            _, step = session.run([train_op, global_step])
            if step % 50 == 0:
                print(f"{name}: global step {step}", flush=True)
    print(f"{name}: done", flush=True)


if __name__ == "__main__":
    main()
