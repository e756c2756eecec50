"""What a command's exit code means to a person reading a transcript.

Some programs exit 1 to answer a question, not to report a failure: ``rg`` and ``grep`` found no
match, ``diff``/``cmp``/``git diff --exit-code`` found differences, ``test``/``[`` evaluated to
false. An agent runs them constantly to look around; showing each as a red failure hides the
real ones. :func:`benign_exit` names such an outcome; every other non-zero exit is a failure.

The exit status of a shell line is its last command's (``cd src && rg foo`` is ``rg``'s;
``rg foo | head`` is ``head``'s), so only the last command of the line is looked at, past
``bash -lc``/``sh -c`` wrappers, environment assignments and ``sudo``/``time``/``command``.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Optional

# Program -> what its exit 1 means.
EXIT_1_MEANS = {
    "rg": "no match",
    "grep": "no match",
    "egrep": "no match",
    "fgrep": "no match",
    "zgrep": "no match",
    "ag": "no match",
    "ack": "no match",
    "pgrep": "no match",
    "diff": "differences",
    "cmp": "differences",
    "test": "false",
    "[": "false",
    "[[": "false",
}
# git subcommands whose exit 1 is an answer: git grep (no match), git diff with --exit-code or
# --quiet (differences).
_GIT_DIFF_FLAGS = ("--exit-code", "--quiet")
_WRAPPERS = {"sudo", "time", "command", "nice", "nohup", "env", "exec", "timeout"}
_SHELLS = {"bash", "sh", "zsh", "dash"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


_OPERATORS = frozenset({"&&", "||", ";", "|", "&", "|&", ";;"})


def _tokens(line: str) -> list[str]:
    """Words and control operators of a shell line (quotes respected)."""
    lexer = shlex.shlex(line.replace("\n", ";"), posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    try:
        return list(lexer)
    except ValueError:  # unbalanced quotes: the words as they come
        return line.split()


def last_command(command: Any) -> list[str]:
    """The words of the command whose exit status the line returns (see the module doc)."""
    if isinstance(command, list):
        words = [str(w) for w in command]
    elif isinstance(command, str):
        words = _tokens(command)
    else:
        return []
    for _ in range(4):  # bash -lc "sh -c '...'" at most this deep
        if len(words) >= 3 and words[0].rsplit("/", 1)[-1] in _SHELLS and words[1].startswith("-") and "c" in words[1]:
            words = _tokens(words[2])
        else:
            break
    last: list[str] = []
    for word in words:
        if word in _OPERATORS or set(word) <= set(";&|"):
            if word not in ("&",) or last:
                last = []
            continue
        last.append(word)
    words = last
    while words and (_ASSIGNMENT.match(words[0]) or words[0] in _WRAPPERS):
        words = words[1:]
        while words and (words[0].startswith("-") or re.fullmatch(r"[0-9.]+[smhd]?", words[0])):
            words = words[1:]
    return words


def benign_exit(command: Any, exit_code: Any) -> Optional[str]:
    """``"no match"``, ``"differences"`` or ``"false"`` when ``exit_code`` 1 of ``command`` is
    an answer rather than a failure; ``None`` otherwise (any other code, any other program)."""
    if exit_code != 1 or isinstance(exit_code, bool):
        return None
    words = last_command(command)
    if not words:
        return None
    program = words[0].rsplit("/", 1)[-1]
    if program == "git" and len(words) > 1:
        sub = words[1]
        if sub == "grep":
            return "no match"
        if sub == "diff" and any(w in _GIT_DIFF_FLAGS for w in words[2:]):
            return "differences"
        return None
    return EXIT_1_MEANS.get(program)
