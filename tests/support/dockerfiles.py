"""Reading images/*.Dockerfile with BuildKit's own parser (PyPI `dockerfile`) and the build context's .dockerignore.

The static tests check what a build would check first: the file parses, every stage's base is pinned, every COPY
source exists and survives .dockerignore, and the command the image runs exists in a plain (non-editable) install of
the project. (operator, router and engine-cpu are also built and run: tests/support/images.py; engine-gpu's base
cannot be pulled here, so the static checks are all it gets.)
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import dockerfile

from tests.support.paths import ROOT

IMAGES = ROOT / "images"
DOCKERIGNORE = ROOT / ".dockerignore"
DOCKERFILES = sorted(IMAGES.glob("*.Dockerfile"))


@dataclass
class Stage:
    name: str | None
    base: str  # after ARG substitution
    instructions: list[dockerfile.Command] = field(default_factory=list)

    def last(self, cmd: str) -> dockerfile.Command | None:
        found = [i for i in self.instructions if i.cmd == cmd]
        return found[-1] if found else None


@dataclass
class ParsedDockerfile:
    path: Path
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]


def substitute(text: str, args: dict[str, str]) -> str:
    def repl(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name not in args:
            raise AssertionError(f"${name} has no default value")
        return args[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", repl, text)


def parse_arg(command: dockerfile.Command) -> tuple[str, str | None]:
    (spec,) = command.value
    name, _, default = spec.partition("=")
    return name, (default if "=" in spec else None)


@cache
def parse(path: Path) -> ParsedDockerfile:
    commands = dockerfile.parse_file(str(path))
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for command in commands:
        if command.cmd == "ARG" and not stages:
            name, default = parse_arg(command)
            if default is not None:
                global_args[name] = default
            continue
        if command.cmd == "FROM":
            value = list(command.value)
            name = value[2] if len(value) == 3 and value[1].upper() == "AS" else None
            stages.append(Stage(name=name, base=substitute(value[0], global_args)))
            continue
        if not stages:
            raise AssertionError(f"{path.name}:{command.start_line}: {command.cmd} before the first FROM")
        stages[-1].instructions.append(command)
    return ParsedDockerfile(path=path, global_args=global_args, stages=stages)


def copy_sources(parsed: ParsedDockerfile) -> list[str]:
    """Context paths that COPY/ADD instructions read (not --from=stage copies)."""
    out = []
    for stage in parsed.stages:
        for ins in stage.instructions:
            if ins.cmd in {"COPY", "ADD"} and not any(f.startswith("--from=") for f in ins.flags):
                out += list(ins.value[:-1])
    return out


# --- .dockerignore, with Docker's semantics: patterns in order, the last match wins, `!` re-includes, a pattern
# that matches a parent directory matches everything below it, `**` spans directories. ------------------------------

def _glob_regex(pattern: str) -> re.Pattern[str]:
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out += "(?:.*/)?"
            i += 3
        elif pattern.startswith("**", i):
            out += ".*"
            i += 2
        elif pattern[i] == "*":
            out += "[^/]*"
            i += 1
        elif pattern[i] == "?":
            out += "[^/]"
            i += 1
        else:
            out += re.escape(pattern[i])
            i += 1
    return re.compile(out + r"\Z")


@cache
def ignore_rules() -> tuple[tuple[bool, re.Pattern[str]], ...]:
    rules = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line[1:] if negate else line
        pattern = pattern.strip("/")
        rules.append((negate, _glob_regex(pattern)))
    return tuple(rules)


def in_context(path: str) -> bool:
    """Whether the file or directory `path` (relative to the context root) is sent with the build context."""
    path = path.strip("/").removeprefix("./")
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    excluded = False
    for negate, regex in ignore_rules():
        if any(regex.match(c) for c in candidates):
            excluded = not negate
    return not excluded
