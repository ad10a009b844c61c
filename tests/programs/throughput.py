"""Node-to-node throughput, the plain way: one side sends N MB over TCP, the other times them.

    python throughput.py serve PORT            # prints "received BYTES bytes in SECONDS s: MBIT Mbit/s"
    python throughput.py send HOST PORT MB
"""

import socket
import sys
import time


def serve(port: int) -> None:
    with socket.create_server(("0.0.0.0", port)) as server:
        print("listening", flush=True)
        connection, _ = server.accept()
        with connection:
            received, started = 0, None
            while True:
                chunk = connection.recv(1 << 20)
                if not chunk:
                    break
                started = started or time.monotonic()
                received += len(chunk)
            seconds = time.monotonic() - started
    print(f"received {received} bytes in {seconds:.3f} s: {received * 8 / seconds / 1e6:.1f} Mbit/s", flush=True)


def send(host: str, port: int, megabytes: int) -> None:
    block = b"x" * (1 << 20)
    for _ in range(100):
        try:
            connection = socket.create_connection((host, port), timeout=5)
            break
        except OSError:
            time.sleep(0.1)
    with connection:
        for _ in range(megabytes):
            connection.sendall(block)


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(int(sys.argv[2]))
    else:
        send(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
