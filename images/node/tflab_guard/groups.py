"""Process groups: alive or not, stopped as TensorFlow's servers need (some ignore SIGTERM)."""

import os
import signal
import time


def group_alive(pgid):
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pgid, grace, force=False):
    """SIGTERM the group, SIGKILL what is left after `grace` seconds."""
    if not force:
        try:
            os.killpg(pgid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not group_alive(pgid):
                return
            time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def exit_code(status):
    """A Popen return code as a shell reports it (128 + signal for a killed process)."""
    return 128 - status if status < 0 else status
