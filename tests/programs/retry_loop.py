"""A program that waits in its own retry loop, printing nothing: it reads the cluster from TF_CONFIG, finds no
chief it likes, and retries (a decorator of its own, as @retrying.retry does) for minutes. Its real error, a
ValueError, is never shown while it retries."""
import json, os, time
def with_retries(attempts=100, wait_s=5):
    def wrap(fn):
        def wrapped(*a, **k):
            for _ in range(attempts):
                try:
                    return fn(*a, **k)
                except ValueError:
                    time.sleep(wait_s)
            raise RuntimeError("gave up")
        return wrapped
    return wrap
@with_retries()
def read_cluster():
    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    raise ValueError("no chief in %r" % config)
def main():
    import tensorflow as tf
    read_cluster()
main()
