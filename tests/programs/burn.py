"""A node that only computes: every node burns its CPU for SECONDS, printing `step N` (ps0 also listens on 2222).

    python burn.py JOB SECONDS
"""

import socket
import sys
import time

job, seconds = sys.argv[1], float(sys.argv[2])
if job == "ps":
    server = socket.create_server(("0.0.0.0", 2222))  # what tflab waits on before it releases the workers
end, step, x = time.monotonic() + seconds, 0, 0
while time.monotonic() < end:
    for i in range(200_000):
        x = (x * 31 + i) % 1_000_003
    step += 1
    print(f"step {step}", flush=True)
if job == "ps":
    time.sleep(3600)  # a server serves until tflab stops it
