"""Read and write vLLM flags in a container spec, whatever shape the argv comes in.

Three shapes are common (DESIGN §3):

* ``args``:    ``command: [vllm, serve]`` (or no command) and the flags in ``args``;
* ``command``: the whole argv in ``command`` (``[vllm, serve, model, --max-num-seqs, 8]``);
* ``shell``:   one ``sh -c`` string (``command: [sh, -c, "vllm serve m --max_num_seqs 8"]``,
  or ``command: [sh, -c]`` with the string as the single arg).

Reading accepts ``--flag value``, ``--flag=value``, underscore spellings
(``--max_num_seqs``) and vLLM's short alias ``-tp`` of ``--tensor-parallel-size``. Writing
removes every spelling of the flag and leaves one canonical ``--flag=value`` in the place of
the first occurrence (or at the end), in the same shape.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass

SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/env sh"}
# vLLM's single-dash spellings of the flags kneecap reads (vllm/engine/arg_utils.py: `-tp`)
SHORT_ALIASES = {"-tp": "--tensor-parallel-size"}


def canonical_flag(flag: str) -> str:
    """'--max_num_seqs' / 'max-num-seqs' -> '--max-num-seqs'."""
    return "--" + flag.lstrip("-").replace("_", "-")


def _flag_of(token: str) -> str | None:
    """Canonical flag name of a token that is a long option or vLLM's short alias of one, else None."""
    name = token.split("=", 1)[0]
    if name in SHORT_ALIASES:
        return SHORT_ALIASES[name]
    if not token.startswith("--") or len(token) <= 2:
        return None
    return canonical_flag(name)


def get_flag(argv: list[str], flag: str) -> str | None:
    """Value of a value-taking flag in argv (last occurrence wins, as in argparse), or None."""
    want = canonical_flag(flag)
    value = None
    for i, tok in enumerate(argv):
        if _flag_of(tok) != want:
            continue
        if "=" in tok:
            value = tok.split("=", 1)[1]
        elif i + 1 < len(argv):
            value = argv[i + 1]
    return value


def _edited(argv: list[str], flag: str, value, keep_spelling: bool) -> list[tuple[int | None, str]]:
    """argv with `flag` set to `value`, each token with the index it came from (None: new).

    Every occurrence of the flag goes; one setting takes the place of the first (or is
    appended): canonical ``--flag=value``, or with ``keep_spelling`` the first occurrence as
    it was written (``--max_num_seqs 256`` -> ``--max_num_seqs 64``), only its value changed."""
    want = canonical_flag(flag)
    out: list[tuple[int | None, str]] = []
    placed = False
    i = 0
    while i < len(argv):
        tok = argv[i]
        if _flag_of(tok) != want:
            out.append((i, tok))
            i += 1
            continue
        if not placed:
            placed = True
            if not keep_spelling:
                out.append((i, f"{want}={value}"))
            elif "=" in tok:
                out.append((i, f"{tok.split('=', 1)[0]}={value}"))
            elif i + 1 < len(argv):
                out += [(i, tok), (i + 1, str(value))]
            else:
                out.append((i, f"{tok}={value}"))
        i += 1 if "=" in tok else 2
    if not placed:
        out.append((None, f"{want}={value}"))
    return out


def set_flag(argv: list[str], flag: str, value, *, keep_spelling: bool = False) -> list[str]:
    """argv with every spelling of `flag` removed and one `--flag=value` in its place
    (``keep_spelling``: the first occurrence as written, with the new value)."""
    return [tok for _, tok in _edited(argv, flag, value, keep_spelling)]


def remove_flag(argv: list[str], flag: str) -> list[str]:
    """argv without any spelling of a value-taking flag."""
    want = canonical_flag(flag)
    out, i = [], 0
    while i < len(argv):
        if _flag_of(argv[i]) == want:
            i += 1 if "=" in argv[i] else 2
            continue
        out.append(argv[i])
        i += 1
    return out


@dataclass(frozen=True)
class ContainerArgv:
    """Where a container keeps its vLLM argv: shape, and the argv tokens as vLLM sees them."""

    shape: str  # "args" | "command" | "shell"
    argv: list[str]


def _is_shell(command: list[str]) -> bool:
    return bool(command) and command[0] in SHELLS and "-c" in command[1:]


def read_argv(container: dict) -> ContainerArgv:
    """The container's argv in one of the three shapes."""
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    if _is_shell(command):
        rest = command[command.index("-c") + 1:]
        script = rest[0] if rest else (args[0] if args else "")
        return ContainerArgv("shell", shlex.split(script))
    if command and command[0] in SHELLS and args[:1] == ["-c"]:
        return ContainerArgv("shell", shlex.split(args[1] if len(args) > 1 else ""))
    if args:
        return ContainerArgv("args", command + args)
    return ContainerArgv("command", command)


def write_argv(container: dict, argv: list[str]) -> dict:
    """A copy of `container` with its argv replaced, keeping its shape."""
    out = copy.deepcopy(container)
    shape = read_argv(container).shape
    if shape == "shell":
        command = list(container.get("command") or [])
        args = list(container.get("args") or [])
        script = shlex.join(argv)
        if _is_shell(command):
            k = command.index("-c") + 1
            if len(command) > k:
                out["command"] = command[:k] + [script] + command[k + 1:]
            else:
                out["args"] = [script] + args[1:]
        else:
            out["args"] = ["-c", script] + args[2:]
    elif shape == "args":
        n = len(container.get("command") or [])
        out["args"] = argv[n:]
    else:
        out["command"] = argv
    return out


def container_flag(container: dict, flag: str) -> str | None:
    return get_flag(read_argv(container).argv, flag)


def set_container_flag(container: dict, flag: str, value, *, keep_spelling: bool = False) -> dict:
    """A copy of `container` with `flag` set, in the container's own shape (``keep_spelling``:
    see :func:`set_flag`). With the argv split between ``command`` and ``args``, each token
    stays on its side (a new one goes to the end of ``args``)."""
    ca = read_argv(container)
    if ca.shape != "args":
        return write_argv(container, set_flag(ca.argv, flag, value, keep_spelling=keep_spelling))
    n = len(container.get("command") or [])
    edited = _edited(ca.argv, flag, value, keep_spelling)
    out = copy.deepcopy(container)
    if n:
        out["command"] = [tok for src, tok in edited if src is not None and src < n]
    out["args"] = [tok for src, tok in edited if src is None or src >= n]
    return out
