"""A node that only serves, as the Kubeflow operator's smoke tests' workers and parameter servers do: its
TensorFlow server, made from TF_CONFIG, joined for ever (Server.join() never returns)."""

import json
import os

import tensorflow as tf

config = json.loads(os.environ["TF_CONFIG"])
task = config["task"]
server = tf.distribute.Server(tf.train.ClusterSpec(config["cluster"]), job_name=task["type"],
                              task_index=task["index"])
print(f"{task['type']}:{task['index']} serves at {server.target}", flush=True)
server.join()
