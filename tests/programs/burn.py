"""A node that only computes: every node burns CPUs for SECONDS, printing `step N` (ps0 also listens on 2222).

    python burn.py JOB SECONDS [PROCESSES]

PROCESSES (1 unless given) burn side by side, the first printing the steps: a test makes four
nodes busier than the host's CPUs, however many the host has.
"""

import os
import socket
import sys
import time

job, seconds = sys.argv[1], float(sys.argv[2])
processes = int(sys.argv[3]) if len(sys.argv) > 3 else 1
if job == "ps":
    server = socket.create_server(("0.0.0.0", 2222))  # what tflab waits on before it releases the workers
end = time.monotonic() + seconds
helpers = []
for _ in range(processes - 1):
    pid = os.fork()
    if pid == 0:  # a helper: burn quietly, then go
        while time.monotonic() < end:
            sum(i * i for i in range(200_000))
        os._exit(0)
    helpers.append(pid)
step, x = 0, 0
while time.monotonic() < end:
    for i in range(200_000):
        x = (x * 31 + i) % 1_000_003
    step += 1
    print(f"step {step}", flush=True)
for pid in helpers:
    os.waitpid(pid, 0)
if job == "ps":
    time.sleep(3600)  # a server serves until tflab stops it
