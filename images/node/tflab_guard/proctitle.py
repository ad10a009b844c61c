"""The guard's own title: what `ps` and `top` show for it (`tflab-guard run KEY`), never its program's command line.

A user's `pkill -f train.py` must reach the program alone, as on a cluster's machine. Like setproctitle, this
writes the title over the memory the kernel shows as the command line (argv, then the environment's strings,
which Python no longer uses once the environment is set again), and sets the short name `top` shows. Best effort: where it cannot, the title stays as it was.
"""

import os

PR_SET_NAME = 15


def _areas():
    """arg_start, arg_end, env_start, env_end of this process (proc(5), since Linux 3.5)."""
    with open("/proc/self/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return [int(value) for value in fields[45:49]]


def set_title(title, short):
    """Make /proc/self/cmdline read `title`, and /proc/self/comm `short` (15 bytes at most)."""
    try:
        import ctypes  # here: a guard that sets no title (a stop, a probe) need not load it

        arg_start, _arg_end, _env_start, env_end = _areas()
        # libc's environment must not point into the area overwritten below: set every variable again.
        for key, value in list(os.environ.items()):
            os.environ[key] = value
        size = env_end - arg_start
        if arg_start <= 0 or size <= 1:
            return False
        data = title.encode("utf-8", "replace")[:size - 1]
        ctypes.memmove(arg_start, data + b"\0" * (size - len(data)), size)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_NAME, ctypes.c_char_p(short.encode("utf-8", "replace")[:15]), 0, 0, 0)
    except (OSError, ValueError, IndexError, AttributeError):
        return False
    return True
