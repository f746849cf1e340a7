"""A real TensorFlow client: MultiWorkerMirroredStrategy from the served TF_CONFIG, all-reduce.

Run one per node under `rallypoint exec`, which puts the served TF_CONFIG into os.environ:

    rallypoint exec -- python tf_allreduce.py

Every task (chief or worker) contributes its global task number + 1; prints one line
``RESULT {json}`` and exits 0 only when the all-reduced sum is right. With CLIENT_CRASH=N
task N exits 3 at once in attempt 0 (RALLYPOINT_ATTEMPT), for the restart tests.
"""

from __future__ import annotations

import json
import os
import socket
import sys


def main() -> int:
    tf_config = json.loads(os.environ["TF_CONFIG"])
    cluster, task = tf_config["cluster"], tf_config["task"]
    # Global order: the chief first, then the workers, as TensorFlow numbers them.
    order = [("chief", i) for i in range(len(cluster.get("chief", [])))]
    order += [("worker", i) for i in range(len(cluster.get("worker", [])))]
    number = order.index((task["type"], task["index"]))
    attempt = os.environ.get("RALLYPOINT_ATTEMPT")
    if os.environ.get("CLIENT_CRASH") == str(number) and attempt == "0":
        print(f"CRASH task {number} in attempt 0", flush=True)  # the restart tests' fault
        return 3

    import tensorflow as tf  # late: the import is slow

    strategy = tf.distribute.MultiWorkerMirroredStrategy()

    @tf.function
    def step() -> tf.Tensor:
        context = tf.distribute.get_replica_context()
        return context.all_reduce(tf.distribute.ReduceOp.SUM, tf.constant(float(number + 1)))

    result = strategy.experimental_local_results(strategy.run(step))[0]
    total = float(result.numpy())
    expected = len(order) * (len(order) + 1) / 2
    ok = total == expected and strategy.num_replicas_in_sync == len(order)
    print(
        "RESULT "
        + json.dumps(
            {
                "ok": ok,
                "task": task,
                "replicas": strategy.num_replicas_in_sync,
                "sum": total,
                "expected": expected,
                "host": socket.gethostname(),
                "cluster": cluster,
            }
        ),
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
