# -*- coding: utf-8 -*-
"""Asynchronous distributed training written as the classic books do (third-party style).

Flags, a parameter server that joins forever, replica_device_setter, MonitoredTrainingSession,
and progress printed its own way: "After N training steps (M global steps), loss on training
batch is X. (S sec/batch)". Data: the digits tflab ships (/data/digits.npz).
"""
import time

import numpy as np
import tensorflow as tf

flags = tf.compat.v1.flags
flags.DEFINE_string("job_name", "worker", "ps or worker")
flags.DEFINE_integer("task_id", 0, "task index")
flags.DEFINE_string("ps_hosts", "", "comma separated")
flags.DEFINE_string("worker_hosts", "", "comma separated")
flags.DEFINE_string("model_save_path", "/runs/book", "where checkpoints go")
FLAGS = flags.FLAGS

TRAINING_STEPS = 600
BATCH_SIZE = 64
LEARNING_RATE = 0.05


def build():
    data = np.load("/data/digits.npz")
    xs, ys = data["x_train"].reshape(-1, 64).astype("float32") / 16.0, data["y_train"].astype("int64")
    x = tf.compat.v1.placeholder(tf.float32, [None, 64])
    y_ = tf.compat.v1.placeholder(tf.int64, [None])
    w = tf.compat.v1.get_variable("w", [64, 10], initializer=tf.compat.v1.glorot_uniform_initializer())
    b = tf.compat.v1.get_variable("b", [10], initializer=tf.compat.v1.zeros_initializer())
    y = tf.matmul(x, w) + b
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y_, logits=y))
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.GradientDescentOptimizer(LEARNING_RATE).minimize(loss, global_step=global_step)
    return xs, ys, x, y_, loss, global_step, train_op


def main(argv=None):
    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
    cluster = tf.train.ClusterSpec({"ps": FLAGS.ps_hosts.split(","), "worker": FLAGS.worker_hosts.split(",")})
    server = tf.distribute.Server(cluster, job_name=FLAGS.job_name, task_index=FLAGS.task_id)
    if FLAGS.job_name == "ps":
        server.join()
    is_chief = FLAGS.task_id == 0
    with tf.compat.v1.device(tf.compat.v1.train.replica_device_setter(
            worker_device="/job:worker/task:%d" % FLAGS.task_id, cluster=cluster)):
        xs, ys, x, y_, loss, global_step, train_op = build()
        ready = tf.compat.v1.report_uninitialized_variables()
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", "/job:worker/task:%d" % FLAGS.task_id])
    if not is_chief:
        with tf.compat.v1.Session(server.target, config=config) as probe:
            while probe.run(ready).size:
                time.sleep(0.5)
    hooks = [tf.compat.v1.train.StopAtStepHook(last_step=TRAINING_STEPS)]
    rng = np.random.RandomState(FLAGS.task_id)
    with tf.compat.v1.train.MonitoredTrainingSession(master=server.target, is_chief=is_chief, hooks=hooks,
                                                     config=config, checkpoint_dir=FLAGS.model_save_path,
                                                     save_checkpoint_secs=None, save_summaries_steps=None,
                                                     log_step_count_steps=None) as sess:
        step = 0
        start_time = time.time()
        while not sess.should_stop():
            batch = rng.randint(0, len(xs), BATCH_SIZE)
            _, loss_value, global_step_value = sess.run([train_op, loss, global_step],
                                                        feed_dict={x: xs[batch], y_: ys[batch]})
            if step > 0 and step % 50 == 0:
                sec_per_batch = (time.time() - start_time) / step
                print("After %d training steps (%d global steps), loss on training batch is %g. (%.3f sec/batch)"
                      % (step, global_step_value, loss_value, sec_per_batch))
            step += 1


if __name__ == "__main__":
    tf.compat.v1.app.run()
