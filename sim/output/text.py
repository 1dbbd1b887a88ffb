"""Text for the terminal: lines wrapped with a hanging indent (:func:`wrapped`, :func:`say`) and
a verdict said as its answer and the clauses after it (:class:`VerdictText`; the rule that makes
one is :mod:`sim.whatif.verdict`'s)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

_GLUE = "\x00"  # joins a number to its unit while wrapping (a character textwrap does not split at)
_UNIT = re.compile(r"(\d) (ms|us|s|MiB|GB|tok/s|req/s|tokens?|requests?)\b")


def wrapped(text: str, width: int | None = None, first: str = "", rest: str = "    ") -> list[str]:
    """``text`` as printed lines of at most ``width`` columns (default: the terminal's,
    ``shutil.get_terminal_size``, 100 where there is none; at least 40): the first line starts
    with ``first``, the others with ``rest`` (a hanging indent, so that a reader sees where one
    item ends). Words are never broken: a word longer than the width overruns it. A unit stays
    on its number's line ("25.38 ms", not "25.38" and "ms" on the next)."""
    import shutil
    import textwrap

    width = max(40, width or shutil.get_terminal_size((100, 24)).columns)
    glued = _UNIT.sub(lambda m: m.group(1) + _GLUE + m.group(2), text)
    lines = textwrap.wrap(glued, width, initial_indent=first, subsequent_indent=rest, break_long_words=False,
                          break_on_hyphens=False)
    return [line.replace(_GLUE, " ") for line in lines] or [first.rstrip()]


def say(text: str) -> None:
    """Print ``text`` as :func:`wrapped` lines (a note, a warning, a hint), the terminal's width."""
    print("\n".join(wrapped(text)))


@dataclass(frozen=True)
class VerdictText:
    """A verdict as said (a run's, :meth:`sim.whatif.verdict.Verdict.text`, or a sweep's,
    :func:`sim.whatif.sweep_verdict.sweep_verdict_text`).

    Attributes:
        head: the answer, ``verdict: ...``.
        clauses: what follows it, in order: the gain, the noise that would hide it, what the
            answer stands on (each clause one thought; it may hold ``;`` within).
        tail: said last in brackets on the one line (a sweep's run-to-run CV); '' for none.
    """

    head: str
    clauses: tuple = ()
    tail: str = ""

    def line(self) -> str:
        """The one-line form: ``head: clause; clause; ... [tail]`` (``summary.json``'s ``line``)."""
        text = self.head + (": " + "; ".join(self.clauses) if self.clauses else "")
        return text + (f" [{self.tail}]" if self.tail else "")

    def block(self, width: Optional[int] = None) -> str:
        """The printed form: the head on a line of its own, then each clause (and the tail) as an
        indented item ``  - ...``, each wrapped at ``width`` columns with its continuation lines
        indented by four spaces (:func:`wrapped`: default the terminal's width)."""
        lines = wrapped(self.head, width)
        for clause in (*self.clauses, *([self.tail] if self.tail else [])):
            lines += wrapped(clause, width, first="  - ")
        return "\n".join(lines)

    def with_clause(self, clause: str) -> "VerdictText":
        """This text with ``clause`` said after its clauses."""
        return VerdictText(self.head, (*self.clauses, clause), self.tail)
