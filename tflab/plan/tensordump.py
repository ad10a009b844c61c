"""Pages of tensor values in a program's output, told apart from the message around them. Pure.

An error that prints the values it could not take (Keras 3's `Attempt to convert a value
(PerReplica:{ 0: <tf.Tensor: shape=(64, 28, 28), ..., numpy=array([[[0., ...` over two hundred
lines, a restore error's `value=[[ 0.01 ...`) buries its own message. The terminal shows the line
that opens such a dump, then one line saying how many lines of values were left out, then what
follows them; a node's log keeps every line.
"""

from __future__ import annotations

import re

# A line that opens a dump of values: the values follow it.
OPENS = re.compile(r"PerReplica:\{\s*$|numpy=\s*$|<tf\.Tensor: [^>]*numpy=|value=\[\[")
# A line of values: numbers, brackets, commas and ellipses; NumPy's `array([...`; a tensor's head and tail.
VALUES = re.compile(r"^\s*(?:$|\d+: <tf\.Tensor: .*|array\(.*|(?:\.\.\.,?|[-+\d.eE,\s\[\]])*"
                    r"(?:,?\s*shape=\([\d, ]*\))?(?:,?\s*dtype=\w+\))?>?,?\s*)$")


class TensorCut:
    """Reads one program's lines; `show(line)` says what of it the terminal shows (None: nothing)."""

    def __init__(self) -> None:
        self.inside = False
        self.cut = 0

    def show(self, line: str) -> list[str]:
        """The lines to show for `line`: itself, nothing (a value cut), or the note of the cut and itself."""
        if self.inside:
            if VALUES.match(line):
                self.cut += 1
                return []
            self.inside = False
            shown = [self.note()] if self.cut else []
            self.cut = 0
            return shown + self.show(line)
        if OPENS.search(line):
            self.inside = True
        return [line]

    def note(self) -> str:
        return f"... ({self.cut} lines of tensor values left out here: the node's log keeps them)"

    def end(self) -> list[str]:
        """What is left to say once the program's output has ended inside a dump."""
        shown = [self.note()] if self.inside and self.cut else []
        self.inside, self.cut = False, 0
        return shown
