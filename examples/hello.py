"""A cluster hello: every task greets the parameter servers through a ClusterSpec.

Each worker reads /etc/hostname *on the parameter server's device*: the answer can only
come from that machine, so a greeting proves the gRPC path between the two nodes.
Checks a lab in seconds.
"""

from __future__ import annotations

import json
import os

import tensorflow as tf


def main() -> None:
    tf_config = json.loads(os.environ["TF_CONFIG"])
    cluster_dict, task = tf_config["cluster"], tf_config["task"]
    me = os.environ.get("TFLAB_NODE", f"{task['type']}{task['index']}")
    tf.compat.v1.disable_eager_execution()
    cluster = tf.train.ClusterSpec(cluster_dict)
    server = tf.distribute.Server(cluster, job_name=task["type"], task_index=task["index"])
    if task["type"] == "ps":
        print(f"{me}: listening on {cluster_dict['ps'][task['index']]}", flush=True)
        server.join()
        return

    targets = [f"/job:ps/task:{i}" for i in range(len(cluster_dict.get("ps", [])))]
    targets.append(f"/job:{task['type']}/task:{task['index']}")
    answers = []
    for device in targets:
        with tf.device(device):
            answers.append(tf.strings.strip(tf.io.read_file("/etc/hostname")))
    config = tf.compat.v1.ConfigProto(device_filters=targets)
    with tf.compat.v1.Session(server.target, config=config) as session:
        hosts = [h.decode() for h in session.run(answers)]
    for device, host in zip(targets, hosts):
        print(f"{me}: hello from {me} to {device}: answered by machine {host}", flush=True)
    print(f"{me}: the cluster answers ({', '.join(f'{j}={len(t)}' for j, t in cluster_dict.items())})", flush=True)


if __name__ == "__main__":
    main()
