"""worker0 takes 1 GiB of memory (touching every page), the others end at once."""
import os
import time

if os.environ.get("TFLAB_NODE") == "worker0":
    held = bytearray(1 << 30)
    for offset in range(0, len(held), 4096):
        held[offset] = 1
    print("allocated 1 GiB", flush=True)
    time.sleep(5)
