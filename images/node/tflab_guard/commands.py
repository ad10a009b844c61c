"""How a command line is run, as a shell would run it: `VAR=value prog args`, a missing program, Python programs.

A line with shell syntax (pipes, redirections, quotes, `$`...) goes to `sh -c` as it is.
Otherwise its leading `NAME=value` words set the program's environment, the program is
looked up on the node's PATH (a missing one exits 127 with a sentence, as a shell's
`command not found`), and `python script.py ...` of a TensorFlow program may run in an
interpreter that has imported TensorFlow already (`run_program`).
"""

import os
import re
import runpy
import shlex
import shutil
import sys

# What needs a shell beyond words and quotes (shlex reads quotes and backslashes as sh does).
SHELL_CHARS = set("|&;<>()$`*?[]{}~#\n")
# The shell's own words (builtins and keywords): no program of that name is on PATH to look up.
SHELL_WORDS = frozenset(["exec", "exit", "cd", "export", "source", ".", "set", "unset", "eval", "if", "for", "while",
                         "until", "case", "command", "builtin", "trap", "ulimit", "umask", "alias", "read",
                         "wait", "shift", "time", "!", "{", "readonly", "local", "type", "hash"])
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
PYTHON = re.compile(r"^python(3(\.\d+)?)?$")
TF_IMPORT = re.compile(r"^\s*(import\s+tensorflow|from\s+tensorflow)\b", re.MULTILINE)
NOT_FOUND, NOT_EXECUTABLE = 127, 126


class Plan(object):
    """A command line made concrete: `kind` (shell, exec or python), its argv, the variables it sets."""

    def __init__(self, kind, argv, env=None):
        self.kind = kind
        self.argv = argv
        self.env = env or {}

    def environment(self, base):
        """The program's environment: `base` with the line's own `NAME=value` settings."""
        env = dict(base)
        env.update(self.env)
        return env

    def __repr__(self):
        return "Plan(%r, %r, %r)" % (self.kind, self.argv, self.env)


def plan_command(shell=None, argv=None):
    """How to run `shell` (a command line) or `argv` (words): a Plan."""
    if shell is not None:
        if SHELL_CHARS & set(shell):
            return Plan("shell", ["sh", "-c", shell])
        try:
            words = shlex.split(shell)
        except ValueError:  # an unbalanced quote: the shell says so, as it would have
            return Plan("shell", ["sh", "-c", shell])
        first = [w for w in words if not ASSIGNMENT.match(w)][:1]
        if first and first[0] in SHELL_WORDS:  # `exec prog`, `cd dir && ...`: the shell's own words
            return Plan("shell", ["sh", "-c", shell])
    else:
        words = list(argv or [])
    env = {}
    while words and ASSIGNMENT.match(words[0]):
        name, _, value = words[0].partition("=")
        env[name] = value
        words = words[1:]
    if not words:
        raise SystemExit("tflab guard: no command to run")
    kind = "exec"
    if len(words) >= 2 and PYTHON.match(os.path.basename(words[0])) and words[1].endswith(".py"):
        kind = "python"
    return Plan(kind, words, env)


def resolve(program, env):
    """The program's path on the node (PATH of `env`), or None."""
    if "/" in program:
        return program if os.path.exists(program) else None
    return shutil.which(program, path=env.get("PATH", os.defpath))


def missing(plan, env):
    """(exit code, sentence) when the program cannot run here, as a shell would refuse it; else None."""
    if plan.kind == "shell":
        return None  # sh says it itself
    program = plan.argv[0]
    found = resolve(program, env)
    if found is None:
        where = "no such file" if "/" in program else "command not found on the node's PATH"
        return NOT_FOUND, "tflab: %s: %s (exit 127)" % (program, where)
    if os.path.isdir(found) or not os.access(found, os.X_OK):
        return NOT_EXECUTABLE, "tflab: %s: not an executable program (exit 126)" % found
    return None


def same_python(found):
    """Whether the interpreter at `found` is this one, in the same environment (venv) too."""
    here = os.path.abspath(sys.executable)
    there = os.path.abspath(found)
    if os.path.dirname(there) == os.path.dirname(here):
        return True
    in_venv = any(os.path.exists(os.path.join(os.path.dirname(os.path.dirname(p)), "pyvenv.cfg"))
                  for p in (here, there))
    return not in_venv and os.path.realpath(there) == os.path.realpath(here)


def can_run_here(plan, env):
    """Whether a `python script.py` plan would run under this very interpreter, on a TensorFlow program."""
    if plan.kind != "python":
        return False
    found = resolve(plan.argv[0], env)
    if found is None or not same_python(found):
        return False
    try:
        with open(plan.argv[1], encoding="utf-8", errors="replace") as handle:
            return bool(TF_IMPORT.search(handle.read()))
    except OSError:
        return False


def command_line(argv):
    """argv as one line, quoted as a shell would need it (what `ps` should show)."""
    return " ".join(shlex.quote(word) for word in argv)


def run_program(argv):
    """`python script.py args` in this interpreter: the script as __main__, with its own argv and path."""
    from tflab_guard import coldstart

    script = argv[1]
    watch = coldstart.Watch(argv, resolve(argv[0], os.environ) or argv[0], command_line(argv))
    sys.argv = argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    code = 0
    try:
        watch.start()  # what it sets before it imports TensorFlow may need a new interpreter
        runpy.run_path(script, run_name="__main__")
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
        if stop.code is not None and not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - shown as Python shows it, exit code 1
        import traceback

        kind, error, frames = sys.exc_info()
        # From the script's own first frame, as `python script.py` would show it (not the guard's).
        own = frames
        while own is not None and os.path.abspath(own.tb_frame.f_code.co_filename) != os.path.abspath(script):
            own = own.tb_next
        traceback.print_exception(kind, error, own or frames)
        code = 1
    watch.stop()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    return code
