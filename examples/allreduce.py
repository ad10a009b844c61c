"""Synchronous all-reduce training with MultiWorkerMirroredStrategy, from TF_CONFIG alone.

Run in a lab made with `--ps 0` (every node a worker). Each step every worker computes
gradients on its shard and the update is all-reduced, so all workers hold the same model
and report the same loss. Keras 3's `fit` does not work under this strategy (TF 2.16+),
so this is a custom loop over plain variables.

It backs up and restores as Keras' BackupAndRestore does, in the shared runs folder: every
worker saves the model and the step every --backup_every steps (the chief into the backup
folder, the others into scratch folders, as TensorFlow's multi-worker tutorial shows), and
a restarted job resumes from the last backup (`tflab run allreduce --fault "kill worker1 at
step 50" --restarts 1`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import shutil

import tensorflow as tf

from tflab_example import Mlp, limit_gpu_memory, load_dataset, run_dir


def backup_dir(base: str, task_type: str, task_id: int) -> str:
    """Where this worker writes its backup: the chief into `base`, the others into scratch folders beside it."""
    if task_type == "chief" or (task_type == "worker" and task_id == 0):
        return base
    return os.path.join(os.path.dirname(base), f"backup-scratch-{task_type}{task_id}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data_dir", default=os.environ.get("TFLAB_DATA_DIR", "/data"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch_size_per_replica", type=int, default=32)
    parser.add_argument("--learning_rate", type=float, default=0.5)
    parser.add_argument("--hidden_units", type=int, default=128)
    parser.add_argument("--backup_every", type=int, default=25, help="steps between two backups (0: none)")
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
        step_done = tf.Variable(0, dtype=tf.int64, trainable=False, aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    iterator = iter(strategy.distribute_datasets_from_function(dataset_fn))
    resolver = strategy.cluster_resolver
    backup = os.path.join(run_dir("/runs/allreduce"), "backup")
    checkpoint = tf.train.Checkpoint(w1=model.w1, b1=model.b1, w2=model.w2, b2=model.b2, step=step_done)
    writer_dir = backup_dir(backup, resolver.task_type, resolver.task_id)
    manager = tf.train.CheckpointManager(checkpoint, writer_dir, max_to_keep=1)
    latest = tf.train.latest_checkpoint(backup)
    if latest:
        checkpoint.restore(latest)
        print(f"{me}: resuming from the backup at step {int(step_done.numpy())}", flush=True)

    @tf.function
    def train_step(batch):
        losses = strategy.run(lambda x, y: model.sgd_step(x, y, args.learning_rate), args=batch)
        return strategy.reduce(tf.distribute.ReduceOp.MEAN, losses, axis=None)

    writer = tf.summary.create_file_writer(os.path.join(run_dir("/runs/allreduce"), me))
    started, first = time.time(), int(step_done.numpy()) + 1
    loss = float("nan")
    for step in range(first, args.steps + 1):
        loss = float(train_step(next(iterator)))
        step_done.assign(step)
        if args.backup_every and step % args.backup_every == 0:
            manager.save(checkpoint_number=step)  # every worker saves: the chief's copy is the backup
        if step % 25 == 0 or step == first:
            rate = (step - first + 1) / (time.time() - started)
            # The chief measures the model on the test set as it goes: tflab reads a run's time to an accuracy.
            quality = (f" accuracy {model.accuracy(data['x_test'], data['y_test']):.4f}"
                       if resolver.task_id == 0 and step % 100 == 0 else "")
            print(f"{me}: step {step} loss {loss:.6f}{quality} ({rate:.1f} steps/s)", flush=True)
            with writer.as_default():
                tf.summary.scalar("loss", loss, step=step)
    if writer_dir != backup:
        shutil.rmtree(writer_dir, ignore_errors=True)
    accuracy = model.accuracy(data["x_test"], data["y_test"])
    print(f"{me}: final loss {loss:.6f} test accuracy {accuracy:.4f}", flush=True)
    leave_together(strategy, writer)


def leave_together(strategy: tf.distribute.Strategy, writer) -> None:
    """Worker 0 leads TensorFlow's coordination service, so it leaves last. A worker whose heartbeat (every 10 s)
    finds it gone aborts, and may hang instead of exiting (TensorFlow's own multi-worker tests turn the heartbeat
    off for this reason; seen here on Slurm: worker0 done, worker2 still there 30 s later). One last all-reduce
    waits for every worker; then the others leave at once, without the interpreter's slow way out."""
    done = strategy.run(tf.function(lambda: tf.constant(1.0)))
    strategy.reduce(tf.distribute.ReduceOp.SUM, done, axis=None)
    if strategy.cluster_resolver.task_id != 0:
        writer.close()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    main()
