"""A program that sets TensorFlow's import-time variables runs as a cold start would run it.

A program handed to an interpreter that has imported TensorFlow already (the warm standby's
copy, or a `--preload` program) would not see what it sets before its own `import tensorflow`:
`os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")`, `KERAS_BACKEND`, `TF_ENABLE_ONEDNN_OPTS`,
`CUDA_VISIBLE_DEVICES`, `TF_XLA_FLAGS`... are read as TensorFlow, Keras and the libraries under
them are imported. So while the program has not imported one of them yet, its writes to such a
variable are watched: the first that changes one starts the program again in a new interpreter,
from the environment, folder and arguments it was given, as `python script.py` on a cluster's
machine would run it. This process stays its parent: it waits on it, passes no signal of its
own (a stop reaches both: they are one process group) and ends as it ended, so the guard or
the standby's owner records the program's own ending. Writes once TensorFlow is imported are the
program's business: a cold start would see them as late.
"""

import builtins
import os
import signal
import sys

from tflab_guard import proctitle

# The prefixes of what TensorFlow, Keras and the libraries below them (XLA, CUDA, oneDNN, OpenMP, NCCL, gRPC)
# read from the environment as they are imported or load their native side.
IMPORT_TIME = ("TF_", "KERAS_", "XLA_", "CUDA_", "NVIDIA_", "OMP_", "KMP_", "MKL_", "ONEDNN_", "DNNL_", "TPU_",
               "NCCL_", "GRPC_", "JAX_")
# Read later, or changing only what is logged: TF_CONFIG when a strategy or resolver is made (after the
# imports); the C++ log level, which many programs set first thing to quiet TensorFlow (the node's is 2).
LATER = ("TF_CONFIG", "TF_CPP_MIN_LOG_LEVEL")
FRAMEWORKS = ("tensorflow", "keras", "tf_keras")
SAID = "tflab: %s sets %s before it imports TensorFlow: started again in a new Python, as a cluster's machine " \
       "runs it (this node's warm interpreter had imported TensorFlow without it)\n"


def import_time(name):
    """Whether TensorFlow or a library under it reads `name` as it is imported."""
    return name.startswith(IMPORT_TIME) and name not in LATER


class Watch(object):
    """The program's writes to import-time variables, watched until it imports TensorFlow (or Keras)."""

    def __init__(self, argv, executable, title):
        """`argv` as the program was given it, `executable` its interpreter's path on the node, `title` its command
        line as `ps` shows it."""
        self.argv = list(argv)
        self.executable = executable
        self.title = title
        self.env = dict(os.environ)
        self.cwd = os.getcwd()
        self.importing = builtins.__import__
        self.environ_class = os.environ.__class__
        self.done = False

    def start(self):
        watch = self

        class WatchedEnviron(self.environ_class):
            def __setitem__(self, key, value):
                watch.written(key, value)
                super(WatchedEnviron, self).__setitem__(key, value)

            def __delitem__(self, key):
                watch.written(key, None)
                super(WatchedEnviron, self).__delitem__(key)

        def importing(name, *args, **kwargs):
            if not watch.done and (args[3] if len(args) > 3 else kwargs.get("level", 0)) == 0 \
                    and name.partition(".")[0] in FRAMEWORKS:
                watch.stop()
            return watch.importing(name, *args, **kwargs)

        os.environ.__class__ = WatchedEnviron
        builtins.__import__ = importing

    def stop(self):
        """The program imports TensorFlow now: what it sets from here on, a cold start would see as late."""
        if not self.done:
            self.done = True
            builtins.__import__ = self.importing
            os.environ.__class__ = self.environ_class

    def written(self, name, value):
        if self.done or not import_time(name) or os.environ.get(name) == value:
            return
        self.stop()
        start_over(self.argv, self.executable, self.title, self.env, self.cwd, name)


def start_over(argv, executable, title, env, cwd, name):
    """Run `argv` anew in a new interpreter (`executable`; its environment and folder as it started), wait for it,
    and end as it ended (never returns)."""
    script = os.path.basename(argv[1]) if len(argv) > 1 else argv[0]
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os.write(2, (SAID % (script, name)).encode("utf-8", "replace"))
    own = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
    _dispose(own, signal.SIG_IGN)  # a stop reaches the program too: this one waits for its end
    pid = os.fork()
    if pid == 0:
        try:
            _dispose(own + (signal.SIGPIPE, signal.SIGXFSZ), signal.SIG_DFL)  # as a process started anew has them
            os.chdir(cwd)
            os.execve(executable, argv, env)
        except BaseException:  # noqa: BLE001 - never back into the warm interpreter's code
            os.write(2, ("tflab: cannot start %s again: %s\n" % (argv[0], sys.exc_info()[1])).encode())
        os._exit(127)
    proctitle.set_title("tflab-guard cold start of %s" % title, "tflab-cold")
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        _dispose((signum,), signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    os._exit(os.WEXITSTATUS(status))


def _dispose(signals, disposition):
    """Set how these signals are taken (only the main thread may: from another, they stay as they are)."""
    for signum in signals:
        try:
            signal.signal(signum, disposition)
        except (ValueError, OSError):
            pass
