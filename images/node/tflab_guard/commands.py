"""How a command line is run, as a shell would run it: `VAR=value prog args`, a missing program.

A line with shell syntax (pipes, redirections, quotes, `$`...) goes to `sh -c` as it is.
Otherwise its leading `NAME=value` words set the program's environment and the program is
looked up on the node's PATH (a missing one exits 127 with a sentence, as a shell's
`command not found`). Either way the program is a new process started cold, as on a cluster's
machine: nothing of the guard is loaded in it.
"""

import os
import re
import shlex
import shutil

# What needs a shell beyond words and quotes (shlex reads quotes and backslashes as sh does).
SHELL_CHARS = set("|&;<>()$`*?[]{}~#\n")
# The shell's own words (builtins and keywords): no program of that name is on PATH to look up.
SHELL_WORDS = frozenset(["exec", "exit", "cd", "export", "source", ".", "set", "unset", "eval", "if", "for", "while",
                         "until", "case", "command", "builtin", "trap", "ulimit", "umask", "alias", "read",
                         "wait", "shift", "time", "!", "{", "readonly", "local", "type", "hash"])
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
NOT_FOUND, NOT_EXECUTABLE = 127, 126


class Plan(object):
    """A command line made concrete: `kind` (shell or exec), its argv, the variables it sets."""

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
    return Plan("exec", words, env)


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
