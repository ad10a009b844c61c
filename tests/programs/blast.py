"""Traffic through one node's link, the plain way: every worker sends into ps0 at once, or ps0 sends to all.

    python blast.py in|out JOB NODE SECONDS WORKERS      (tflab.yaml: ... {job_name} {node} ...)
`in`: the workers send into ps0 for SECONDS; ps0 prints what it received, in Mbit/s, in all.
`out`: ps0 sends to every worker for SECONDS; each worker prints what it received.
The workers say their name and wait for ps0's go, so all of them start at once. They print
`step N` as they go (a megabyte a step), so tflab sees them progress.
"""

import socket
import sys
import threading
import time

PORT = 2222  # the port tflab waits on before it releases the workers
BLOCK = b"x" * (1 << 20)


def ps(mode: str, seconds: float, workers: int) -> None:
    server = socket.create_server(("0.0.0.0", PORT))
    print("ps0: listening", flush=True)
    lock = threading.Lock()
    ready, total, done, started = [], [0], threading.Event(), [0.0]
    go = threading.Event()

    def serve(connection: socket.socket) -> None:
        with connection:
            connection.settimeout(60)
            try:
                hello = connection.makefile("rb").readline()
            except OSError:
                return
            if not hello.startswith(b"worker"):
                return  # a connection a worker gave up on
            with lock:
                ready.append(hello)
                if len(ready) == workers:
                    go.set()
            go.wait()
            connection.settimeout(None)
            connection.sendall(b"g")
            if mode == "in":
                while True:
                    chunk = connection.recv(1 << 20)
                    if not chunk:
                        break
                    with lock:
                        total[0] += len(chunk)
                with lock:
                    ready.remove(hello)
                    if not ready:
                        rate = total[0] * 8 / (time.monotonic() - started[0]) / 1e6
                        print(f"ps0: received {rate:.1f} Mbit/s from {workers} workers at once", flush=True)
                connection.sendall(b"k")  # all of it arrived: the worker may end
                return
            else:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    connection.sendall(BLOCK)
            with lock:
                ready.remove(hello)
                if not ready:
                    done.set()

    def accept() -> None:
        while True:
            connection, _ = server.accept()
            threading.Thread(target=serve, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    go.wait()
    started[0] = time.monotonic()
    time.sleep(3600)  # a server serves until tflab stops it


def worker(name: str, mode: str, seconds: float) -> None:
    for _ in range(600):
        try:
            connection = socket.create_connection(("ps0", PORT), timeout=30)
            break
        except OSError:
            time.sleep(0.1)
    connection.settimeout(None)  # a shared link may keep one sender waiting a while
    step, received = 0, 0
    with connection:
        connection.sendall(f"{name}\n".encode())
        assert connection.recv(1) == b"g"
        started = time.monotonic()
        if mode == "in":
            while time.monotonic() - started < seconds:
                connection.sendall(BLOCK)
                step += 1
                print(f"step {step}", flush=True)
            connection.shutdown(socket.SHUT_WR)
            connection.recv(1)  # ps0 has it all
        else:
            while True:
                chunk = connection.recv(1 << 20)
                if not chunk:
                    break
                received += len(chunk)
                if received >> 20 > step:
                    step = received >> 20
                    print(f"step {step}", flush=True)
    if mode == "out":
        rate = received * 8 / (time.monotonic() - started) / 1e6
        print(f"{name}: received {rate:.1f} Mbit/s from ps0", flush=True)


if __name__ == "__main__":
    mode, job, node, seconds, workers = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
    if job == "ps":
        ps(mode, seconds, workers)
    else:
        worker(node, mode, seconds)
