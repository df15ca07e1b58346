"""The Dockerfile read as Docker reads it (instructions with continuations joined, the final
stage) and the build context `docker build .` sends given .dockerignore (Docker's matching
rules, over `git ls-files`), without a container engine."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        s = line.strip()
        if s and not s.startswith("#"):
            op, _, args = s.partition(" ")
            out.append((op.upper(), args.strip()))
    return out


def final_stage(text: str) -> list[tuple[str, str]]:
    ins = instructions(text)
    last_from = max(i for i, (op, _) in enumerate(ins) if op == "FROM")
    return ins[last_from:]


def pattern_regex(pattern: str) -> re.Pattern:
    """Docker's .dockerignore matching (moby/patternmatcher): * and ? stop at /, ** spans dirs."""
    p = pattern.strip().rstrip("/")
    out, i = "", 0
    while i < len(p):
        if p.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif p.startswith("**", i):
            out, i = out + ".*", i + 2
        elif p[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif p[i] == "?":
            out, i = out + "[^/]", i + 1
        else:
            out, i = out + re.escape(p[i]), i + 1
    return re.compile(out + "$")


def docker_context(root: Path) -> list[str]:
    """Files `docker build .` sends, given .dockerignore (last matching pattern wins; parents count)."""
    rules = []
    for line in (root / ".dockerignore").read_text().splitlines():
        s = line.strip()
        if s and not s.startswith("#"):
            rules.append((s.startswith("!"), pattern_regex(s.lstrip("!"))))
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=root,
                           capture_output=True, text=True, check=True).stdout.split()
    sent = []
    for f in files:
        if not (root / f).is_file():
            continue
        parts = f.split("/")
        candidates = ["/".join(parts[:k]) for k in range(1, len(parts) + 1)]
        excluded = False
        for negate, rx in rules:
            if any(rx.match(c) for c in candidates):
                excluded = not negate
        if not excluded:
            sent.append(f)
    return sent
