"""The agent skills run as written: ``examples/async_job_watcher/SKILL.md`` and
``skills/outlast/SKILL.md``.

Each skill's fenced blocks are run in order, as an agent following it would run them, against
a fresh SQLite store in the test's folder (``$OUTLAST_STORE``), with the venv's ``outlast``
first on ``PATH`` and the repository root on ``PYTHONPATH``:

- a ``bash`` block is one command a line (``\\`` continues a line), each run by ``bash -c``
  in the test's folder. ``NAME=$(COMMAND)`` keeps what COMMAND printed as ``$NAME`` for the
  later commands (the job id the skill tells the agent to keep);
- a ``python`` block whose first line is ``# FILE.py`` is written to that file; any other is
  run by ``python -``;
- a ``json`` block holding ``mcpServers`` is the MCP server later ``mcp`` blocks talk to; an
  ``mcp`` block is one tool call a line, ``TOOL {JSON arguments}``, made with the MCP SDK's
  own client over stdio (one server for the block).

A command's trailing comment is what the skill promises it gives, in clauses separated by
``;``: ``exit N`` (else 0), ``reads a.b, c`` (its JSON output has these fields), ``a.b == V``
(a field holds the JSON value V), ``until a.b == V`` (the command is repeated until that
holds), ``keep NAME = a.b`` (an MCP result's field, kept as ``$NAME``). Anything else there
fails the test: prose goes on a comment line of its own. ``$NAME`` in arguments and values is
replaced by what was kept. The example paths under ``/tmp/`` move into the test's folder (the
skill tells the agent to choose its own). Every output of a command with ``--json`` must be
JSON; a job document in it must have every field of DESIGN.md.

The general skill must also page the log as the MCP ``logs`` tool does: ``outlast logs ID
--offset N --json`` calls that keep ``next_offset`` for the next one, whose output has that
tool's fields.

A third test runs ``outlast [VERB] --help`` for every ``outlast VERB --option`` the skills
name anywhere (code blocks and inline code) and checks that the verb and its options exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.cli.helpers import BIN, DOC_FIELDS, processes_with_env

ROOT = Path(__file__).resolve().parents[2]
WATCHER = ROOT / "examples" / "async_job_watcher" / "SKILL.md"
GENERAL = ROOT / "skills" / "outlast" / "SKILL.md"
OUTLAST = str(BIN / "outlast")
CALL_TIMEOUT = 90.0  # seconds one command (or tool call) may take before the test fails
UNTIL_TIMEOUT = 60.0  # seconds an `until` clause may take to hold

pytestmark = pytest.mark.timeout(240)

FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
NAME = r"[A-Z_][A-Z0-9_]*"
PATH = r"[A-Za-z_]\w*(?:\.\w+)*"
LOGS_PAGE = re.compile(r"\boutlast logs \S+ --offset \S+.* --json\b")
KEEP_OUTPUT = re.compile(rf"({NAME})=\$\((.*)\)", re.DOTALL)
CLAUSES = {
    "exit": re.compile(r"exit (\d+)"),
    "reads": re.compile(rf"reads ({PATH}(?:, {PATH})*)"),
    "until": re.compile(rf"until ({PATH}) == (.+)"),
    "keep": re.compile(rf"keep ({NAME}) = ({PATH})"),
    "equals": re.compile(rf"({PATH}) == (.+)"),
}


# ---------------------------------------------------------------------- reading a skill
@dataclass
class Expect:
    """What a command's trailing comment promises."""

    exit: int = 0
    reads: list[str] = field(default_factory=list)
    equals: list[tuple[str, str]] = field(default_factory=list)  # (path, JSON text)
    until: list[tuple[str, str]] = field(default_factory=list)
    keep: list[tuple[str, str]] = field(default_factory=list)  # (NAME, path)

    @property
    def wants_json(self) -> bool:
        return bool(self.reads or self.equals or self.until or self.keep)


@dataclass(frozen=True)
class Step:
    """One thing to run: ``kind`` is ``shell``, ``python``, ``file``, ``server`` or ``mcp``."""

    kind: str
    text: str
    where: str  # "SKILL.md:LINE", for messages
    block: int
    expect: Expect = field(default_factory=Expect)


def split_comment(line: str) -> tuple[str, str | None]:
    """The code of a line and its trailing ``#`` comment (outside quotes, at a word start)."""
    quote: str | None = None
    escaped = False
    for i, char in enumerate(line):
        if escaped:
            escaped = False
        elif char == "\\" and quote != "'":
            escaped = True
        elif quote is not None:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), None


def parse_expect(comment: str | None, where: str) -> Expect:
    """The clauses of a trailing comment; anything that is not a clause fails the test."""
    expect = Expect()
    for clause in (comment or "").split(";"):
        clause = clause.strip()
        if not clause:
            continue
        for kind, pattern in CLAUSES.items():
            match = pattern.fullmatch(clause)
            if match is None:
                continue
            if kind == "exit":
                expect.exit = int(match[1])
            elif kind == "reads":
                expect.reads += match[1].split(", ")
            else:
                getattr(expect, kind).append((match[1], match[2].strip()))
            break
        else:
            raise AssertionError(f"{where}: not a clause of the skill's comments: {clause!r}")
    return expect


def logical_lines(body: str, first_line: int) -> Iterator[tuple[int, str]]:
    """The lines of a block with ``\\`` continuations joined, and the number of each's first."""
    pending, start = "", first_line
    for number, line in enumerate(body.splitlines(), first_line):
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1]
            continue
        yield start, pending + line
        pending = ""
    assert not pending, f"line {start}: a continuation with nothing after it"


def commands(body: str, kind: str, where: str, block: int, first_line: int) -> Iterator[Step]:
    """The commands of a ``bash`` or ``mcp`` block: comment-only and blank lines left out."""
    for number, line in logical_lines(body, first_line):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        code, comment = split_comment(line)
        at = f"{where}:{number}"
        yield Step(kind, code.strip(), at, block, parse_expect(comment, at))


def parse_skill(path: Path) -> list[Step]:
    """Every step of the skill at ``path``, in order."""
    text = path.read_text()
    steps: list[Step] = []
    for block, match in enumerate(FENCE.finditer(text)):
        lang, body = match[1], match[2]
        first = text.count("\n", 0, match.start(2)) + 1
        where = f"{path.parent.name}/{path.name}"
        at = f"{where}:{first}"
        if lang in ("bash", "sh", "shell"):
            steps += commands(body, "shell", where, block, first)
        elif lang == "mcp":
            steps += commands(body, "mcp", where, block, first)
        elif lang == "python":
            named = re.fullmatch(r"# (\S+\.py)", body.splitlines()[0])
            steps.append(Step("file" if named else "python", body, at, block))
        elif lang == "json" and "mcpServers" in body:
            steps.append(Step("server", body, at, block))
    return steps


def expand(text: str, kept: dict[str, Any]) -> str:
    """``$NAME`` (or ``"$NAME"``) of a kept value replaced by that value as JSON."""

    def value(match: re.Match[str]) -> str:
        name = match[1] or match[2]
        return json.dumps(kept[name]) if name in kept else match[0]

    return re.sub(rf'"\$({NAME})"|\$({NAME})\b', value, text)


def lookup(doc: Any, path: str) -> Any:
    """The value at a dotted ``path`` of ``doc`` (a digit indexes a list); fails if absent."""
    value = doc
    for part in path.split("."):
        if isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        elif isinstance(value, dict) and part in value:
            value = value[part]
        else:
            raise AssertionError(f"no field {path!r} (at {part!r}) in {json.dumps(doc)[:3000]}")
    return value


def holds(doc: Any, path: str, wanted: str, kept: dict[str, Any]) -> bool:
    return bool(lookup(doc, path) == json.loads(expand(wanted, kept)))


def check_documents(found: Any) -> None:
    """A job document anywhere in ``found`` has every field of DESIGN.md."""
    if isinstance(found, list):
        for item in found:
            check_documents(item)
    elif isinstance(found, dict):
        if "kind" in found and "status" in found and "id" in found:
            missing = DOC_FIELDS - set(found)
            assert not missing, f"a job document without {sorted(missing)}: {found}"
        for value in found.values():
            check_documents(value)


# ---------------------------------------------------------------------- running a skill
@dataclass
class Outcome:
    """What one run of a step gave."""

    code: int
    out: str
    err: str
    doc: Any = None

    def __str__(self) -> str:
        return f"exit {self.code}\nstdout: {self.out[:3000]!r}\nstderr: {self.err[:3000]!r}"


class Runner:
    """Runs a skill's steps against a fresh store in ``tmp``, keeping what the skill keeps."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.kept: dict[str, Any] = {}
        env = {k: v for k, v in os.environ.items() if not k.startswith("OUTLAST_")}
        env.pop("PYTHONWARNINGS", None)
        env.update(
            OUTLAST_STORE=f"sqlite://{tmp}/store.db",
            PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
            PYTHONPATH=str(ROOT),
        )
        self.env = env
        self.server: dict[str, Any] | None = None
        self.tools: dict[str, Any] = {}  # name -> the MCP Tool, once a server was asked
        self.called: set[str] = set()
        self.outputs: dict[str, Any] = {}  # a shell step's place -> its JSON output

    def localize(self, text: str) -> str:
        """The skill's example paths under ``/tmp/`` moved into the test's folder."""
        return re.sub(r"(?<![\w/.])/tmp/", f"{self.tmp}/", text)

    def run(self, steps: list[Step]) -> None:
        i = 0
        while i < len(steps):
            step = steps[i]
            if step.kind == "mcp":
                group = [s for s in steps[i:] if s.kind == "mcp" and s.block == step.block]
                self.mcp(group)
                i += len(group)
                continue
            if step.kind == "server":
                (config,) = json.loads(step.text)["mcpServers"].values()
                self.server = config
            elif step.kind == "file":
                name = step.text.splitlines()[0][2:].strip()
                (self.tmp / name).write_text(step.text)
            elif step.kind == "python":
                self.python(step)
            else:
                self.shell(step)
            i += 1

    # ------------------------------------------------------------------ shell and python
    def _bash(self, code: str) -> Outcome:
        env = dict(self.env, **{k: str(v) for k, v in self.kept.items()})
        try:
            proc = subprocess.run(
                ["bash", "-c", code],
                env=env,
                cwd=self.tmp,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=CALL_TIMEOUT,
            )
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"{code!r} did not finish within {CALL_TIMEOUT}s") from exc
        return Outcome(proc.returncode, proc.stdout, proc.stderr)

    def shell(self, step: Step) -> None:
        code = self.localize(step.text)
        keep = KEEP_OUTPUT.fullmatch(code)
        if keep is not None:
            code = keep[2]
        needs_json = step.expect.wants_json or re.search(r"(?<!\S)--json(?!\S)", code)
        deadline = time.monotonic() + UNTIL_TIMEOUT
        while True:
            outcome = self._bash(code)
            context = f"{step.where}: {step.text}\n{outcome}"
            assert outcome.code == step.expect.exit, f"expected exit {step.expect.exit}: {context}"
            if needs_json:
                try:
                    outcome.doc = json.loads(outcome.out)
                except ValueError as exc:
                    raise AssertionError(f"not JSON ({exc}): {context}") from None
            if all(holds(outcome.doc, p, v, self.kept) for p, v in step.expect.until):
                break
            assert time.monotonic() < deadline, f"`until` never held: {context}"
            time.sleep(0.3)
        self.check(step, outcome.doc, context)
        if outcome.doc is not None:
            self.outputs[step.where] = outcome.doc
        if keep is not None:
            value = outcome.out.strip()
            assert value, f"printed nothing to keep as ${keep[1]}: {context}"
            self.kept[keep[1]] = value

    def python(self, step: Step) -> None:
        proc = subprocess.run(
            [str(BIN / "python"), "-"],
            input=self.localize(step.text),
            env=self.env,
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=CALL_TIMEOUT,
        )
        assert proc.returncode == 0, f"{step.where}: exit {proc.returncode}\n{proc.stderr}"

    def check(self, step: Step, doc: Any, context: str) -> None:
        """The fields the skill says to read are there and hold what it says."""
        if doc is None:
            return
        check_documents(doc)
        for path in step.expect.reads:
            lookup(doc, path)
        for path, wanted in step.expect.equals:
            got = lookup(doc, path)
            assert holds(doc, path, wanted, self.kept), (
                f"{path} is {got!r}, not {wanted}: {context}"
            )
        for name, path in step.expect.keep:
            self.kept[name] = lookup(doc, path)

    # ------------------------------------------------------------------ MCP
    def mcp(self, steps: list[Step]) -> None:
        """The block's tool calls, in order, through one ``outlast mcp`` server."""
        try:
            asyncio.run(self._mcp(steps))
        except BaseExceptionGroup as group:  # the client's task groups wrap the failure
            leaf: BaseException = group
            while isinstance(leaf, BaseExceptionGroup):
                leaf = leaf.exceptions[0]
            raise leaf from None

    async def _mcp(self, steps: list[Step]) -> None:
        from mcp import Client
        from mcp.client.stdio import StdioServerParameters

        assert self.server is not None, f"{steps[0].where}: no mcpServers block before it"
        params = StdioServerParameters(
            command=self.server["command"],
            args=list(self.server.get("args", [])),
            env=self.env,
            cwd=str(self.tmp),
        )
        async with Client(params, read_timeout_seconds=CALL_TIMEOUT) as client:
            self.tools = {t.name: t for t in (await client.list_tools()).tools}
            for step in steps:
                await self._call(client, step)

    async def _call(self, client: Any, step: Step) -> None:
        tool, _, raw = self.localize(step.text).partition(" ")
        assert tool in self.tools, f"{step.where}: no tool {tool!r} (the server has {self.tools})"
        arguments = json.loads(expand(raw, self.kept) or "{}")
        unknown = set(arguments) - set(self.tools[tool].input_schema.get("properties", {}))
        assert not unknown, f"{step.where}: {tool} takes no {sorted(unknown)}"
        deadline = time.monotonic() + UNTIL_TIMEOUT
        while True:
            result = await client.call_tool(tool, arguments)
            context = f"{step.where}: {step.text}\n{result.content}"
            assert not result.is_error, f"an error result: {context}"
            doc = result.structured_content
            if all(holds(doc, p, v, self.kept) for p, v in step.expect.until):
                break
            assert time.monotonic() < deadline, f"`until` never held: {context}"
            await asyncio.sleep(0.3)
        self.called.add(tool)
        self.check(step, doc, f"{context}\n{json.dumps(doc)[:3000]}")

    # ------------------------------------------------------------------ cleanup
    def close(self) -> None:
        """Kill whatever the skill left running on this test's store (pools, workers, jobs)."""
        mine = str(self.tmp)
        for proc in processes_with_env("OUTLAST_STORE", lambda v: mine in v):
            with contextlib.suppress(psutil.NoSuchProcess, ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[Runner]:
    made = Runner(tmp_path)
    try:
        yield made
    finally:
        made.close()


# ---------------------------------------------------------------------- the tests
def test_the_async_job_watcher_skill_runs_as_written(runner: Runner) -> None:
    steps = parse_skill(WATCHER)
    assert sum(s.kind == "shell" for s in steps) >= 20, steps
    runner.run(steps)
    # The by-hand run (part B) kept its verified artifact and removed its status files.
    assert (runner.tmp / "export-44.status.json.csv").exists()
    assert sorted(p.name for p in runner.tmp.glob("export-*")) == [
        "export-42.status.json.csv",
        "export-44.status.json.csv",
    ]


def tool_table(text: str) -> dict[str, tuple[set[str], set[str]]]:
    """The skill's side-by-side table: each MCP tool with the arguments and the result fields
    it names (``tool`` (`arg`, …) → `field`, …)."""
    named: dict[str, tuple[set[str], set[str]]] = {}
    for row in re.findall(r"^\|.*\|[ \t]*$", text, re.MULTILINE):
        cell = re.split(r"(?<!\\)\|", row.strip())[-2].strip()
        tool = re.match(r"`(\w+)`", cell)
        if tool is None:
            continue
        given, _, returned = cell.partition("→")
        args = re.search(r"\((.*)\)", given)
        returned = re.sub(r"\([^)]*\)", "", returned)
        named[tool[1]] = (
            set(re.findall(r"`(\w+)`", args[1])) if args else set(),
            set(re.findall(r"`(\w+)`", returned)),
        )
    return named


def test_the_general_outlast_skill_runs_as_written(runner: Runner) -> None:
    pytest.importorskip("mcp")
    steps = parse_skill(GENERAL)
    assert {s.kind for s in steps} == {"shell", "file", "server", "mcp"}, steps
    runner.run(steps)
    assert runner.called == set(runner.tools), "the skill's MCP walk-through skips a tool"
    # the log is paged with `logs --offset N --json`, as the MCP logs tool pages it: the
    # calls name its fields, the next call starts at the kept next_offset, and the output
    # has the tool's fields
    paging = [s for s in steps if s.kind == "shell" and LOGS_PAGE.search(s.text)]
    assert len(paging) >= 2, "the skill does not page the log with logs --offset --json"
    named = {p for s in paging for p in s.expect.reads + [p for p, _ in s.expect.equals]}
    kept = {(n, p) for s in paging for n, p in s.expect.keep}
    assert {"text", "size", "done"} <= named and ("OFFSET", "next_offset") in kept, paging
    assert any('--offset "$OFFSET"' in s.text for s in paging), paging
    logs_fields = set((runner.tools["logs"].output_schema or {}).get("properties", {}))
    for step in paging:
        assert set(runner.outputs[step.where]) == logs_fields, runner.outputs[step.where]
    assert not re.search(r"outlast logs[^\n`]*\| *(wc|tail) -c", GENERAL.read_text())
    table = tool_table(GENERAL.read_text())
    assert set(table) == set(runner.tools), table
    for tool, (args, returned) in table.items():
        schema = runner.tools[tool]
        assert args <= set(schema.input_schema["properties"]), (tool, args)
        outputs = set((schema.output_schema or {}).get("properties", {}))
        assert returned <= outputs, (tool, returned, outputs)


def outlast_calls(text: str) -> Iterator[tuple[str | None, list[str], list[str]]]:
    """Every ``outlast [GLOBAL…] VERB --option…`` in a skill's code (blocks and inline):
    (verb, its options, the options before it)."""
    prose = FENCE.sub("", text)
    spans = [m[2] for m in FENCE.finditer(text)] + re.findall(r"`([^`]+)`", prose)
    for span in spans:
        span = span.replace("\\\n", " ")  # a continued shell line
        for segment in re.split(r"\\?\||;|&&|&|\$\(|\)|\n", span):
            words = segment.split()
            if "outlast" not in words:
                continue
            words = words[words.index("outlast") + 1 :]
            before: list[str] = []
            while words and words[0].startswith("-"):
                before.append(words.pop(0).split("=")[0])
                if before[-1] == "--store" and words:
                    words.pop(0)
            verb = words.pop(0) if words else None
            options = []
            for word in words:
                if word == "--":
                    break
                if re.fullmatch(r"--?[a-z][\w-]*(=.*)?", word):
                    options.append(word.split("=")[0])
            yield verb, options, before


def test_every_outlast_command_the_skills_name_exists() -> None:
    wanted: dict[str | None, set[str]] = {}
    for skill in (WATCHER, GENERAL):
        for verb, options, before in outlast_calls(skill.read_text()):
            wanted.setdefault(verb, set()).update(options)
            wanted.setdefault(None, set()).update(before)
    assert len(wanted) >= 12, wanted
    helps = {  # run side by side: each is a whole interpreter start
        verb: subprocess.Popen(
            [OUTLAST, "--help"] if verb is None else [OUTLAST, verb, "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for verb in wanted
    }
    for verb, proc in helps.items():
        out, err = proc.communicate(timeout=CALL_TIMEOUT)
        assert proc.returncode == 0, f"outlast {verb}: {err}"
        for option in wanted[verb]:
            assert re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", out), (
                f"outlast {verb or ''} has no {option}:\n{out}"
            )
