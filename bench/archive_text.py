"""Realistic text for the archive generator: a Zipf sampler over the vocabulary, the projects
sessions work in (their files, identifiers and commands), and the prose, code, diffs and
command outputs the agents' lines carry.

Everything is a function of the seeds handed in: a project of ``make_project(seed, index)``
and a ``Texts(project, seed)`` produce the same text on every run and in every process, which
is what lets the generator split sessions across worker processes and stay deterministic.
"""

from __future__ import annotations

import random
import time
import uuid
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

import archive_vocab as V
import numpy as np

LANGUAGES = ("python", "typescript", "rust", "go")
LANGUAGE_WEIGHTS = (0.38, 0.32, 0.16, 0.14)


class Zipf:
    """Draws tokens from groups of ranked lists: a group gets ``share`` of the draws, and within
    it the token of rank r is drawn with weight 1 / r**exponent (Zipf's law)."""

    def __init__(self, groups: Sequence[tuple[Sequence[str], float, float]]):
        tokens: list[str] = []
        weights: list[np.ndarray] = []
        for words, share, exponent in groups:
            if not words:
                continue
            w = 1.0 / np.arange(1, len(words) + 1, dtype=np.float64) ** exponent
            weights.append(w / w.sum() * share)
            tokens.extend(words)
        cdf = np.cumsum(np.concatenate(weights))
        self.cdf = cdf / cdf[-1]
        self.tokens = np.array(tokens, dtype=object)
        self._cdf_list: list[float] = self.cdf.tolist()
        self._token_list = tokens

    def draw(self, rng: np.random.Generator, n: int) -> list[str]:
        idx = np.searchsorted(self.cdf, rng.random(n), side="right")
        np.minimum(idx, len(self.tokens) - 1, out=idx)
        return self.tokens[idx].tolist()  # type: ignore[no-any-return]

    def draw_few(self, r: random.Random, n: int) -> list[str]:
        """A few tokens drawn with Python's generator (cheaper than numpy for a handful)."""
        cdf, tokens, last = self._cdf_list, self._token_list, len(self._token_list) - 1
        return [tokens[min(bisect_right(cdf, r.random()), last)] for _ in range(n)]


def _technical_words() -> list[str]:
    """TECH plus the identifier verbs with their inflections and the nouns with plurals."""
    words = list(V.TECH)
    for verb in V.ID_VERBS:
        words.append(verb)
        words.extend(V.inflections(verb))
    for noun in V.ID_NOUNS:
        words.extend((noun, noun + "s" if not noun.endswith("s") else noun + "es"))
    return list(dict.fromkeys(words))


TECHNICAL = _technical_words()


def snake(parts: Sequence[str]) -> str:
    return "_".join(parts)


def camel(parts: Sequence[str]) -> str:
    return parts[0] + "".join(p.capitalize() for p in parts[1:])


def pascal(parts: Sequence[str]) -> str:
    return "".join(p.capitalize() for p in parts)


def new_uuid(r: random.Random) -> str:
    return str(uuid.UUID(int=r.getrandbits(128), version=4))


def iso_ms(ms: int) -> str:
    """A UTC time in milliseconds since the epoch as ``2026-01-20T08:00:01.000Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


@dataclass
class Project:
    """A code base sessions work in: its place, language, files, identifiers and commands.
    File contents are made on first use, from the project's seed and the file's index, so every
    process sees the same files."""

    index: int
    seed: int
    name: str
    package: str
    cwd: str
    language: str
    branches: tuple[str, ...]
    sources: list[str]
    tests: list[str]
    others: list[str]
    functions: list[str]
    classes: list[str]
    constants: list[str]
    variables: list[str]
    test_command: str
    build_command: str
    lint_command: str
    tokens: Zipf
    _files: dict[str, list[str]] = field(default_factory=dict)

    @property
    def all_paths(self) -> list[str]:
        return self.sources + self.tests + self.others

    def file_lines(self, path: str) -> list[str]:
        lines = self._files.get(path)
        if lines is None:
            r = random.Random(hash_seed(self.seed, "file", path))
            if path in self.sources or path in self.tests:
                lines = code_file(self, r, test=path in self.tests)
            else:
                lines = doc_file(self, r, path)
            self._files[path] = lines
        return lines


def hash_seed(*parts: object) -> int:
    """A stable 64-bit seed from the parts (Python's own hash() differs between processes)."""
    import hashlib

    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def make_project(seed: int, index: int) -> Project:
    r = random.Random(hash_seed(seed, "project", index))
    language = r.choices(LANGUAGES, LANGUAGE_WEIGHTS)[0]
    words = V.PROJECT_WORDS
    name = words[r.randrange(len(words))]
    if r.random() < 0.6:
        name += "-" + r.choice(
            (
                "api",
                "web",
                "service",
                "app",
                "server",
                "cli",
                "core",
                "ui",
                "worker",
                "sdk",
                words[r.randrange(len(words))],
            )
        )
    name = f"{name}{index}" if r.random() < 0.15 else name
    package = name.replace("-", "_") if language in ("python", "rust") else name.replace("-", "")
    user = V.USERS[hash_seed(seed, "user") % len(V.USERS)]
    cwd = f"/home/{user}/{r.choice(V.CODE_ROOTS)}/{name}"
    if r.random() < 0.08:
        cwd = f"/Users/{user}/{r.choice(V.CODE_ROOTS)}/{name}"

    def ident(style: str) -> str:
        parts = [r.choice(V.ID_VERBS), r.choice(V.ID_NOUNS)]
        if r.random() < 0.35:
            parts.insert(1, r.choice(V.ADJECTIVES))
        if r.random() < 0.2:
            parts.append(r.choice(V.ID_NOUNS))
        return snake(parts) if style == "snake" else camel(parts)

    style = "snake" if language in ("python", "rust") else "camel"
    functions = list(dict.fromkeys(ident(style) for _ in range(r.randint(150, 600))))
    classes = list(
        dict.fromkeys(
            pascal(
                [r.choice(V.ID_NOUNS)]
                + ([r.choice(V.ID_NOUNS)] if r.random() < 0.7 else [])
                + (
                    [r.choice(("Service", "Manager", "Error", "Config", "Client", "Store", "Handler", "Builder"))]
                    if r.random() < 0.5
                    else []
                )
            )
            for _ in range(r.randint(40, 160))
        )
    )
    constants = list(
        dict.fromkeys(
            "_".join((r.choice(V.ADJECTIVES) + "_" + r.choice(V.ID_NOUNS)).upper().split()) for _ in range(40)
        )
    )
    variables = list(
        dict.fromkeys(
            (snake if style == "snake" else camel)([r.choice(V.ADJECTIVES), r.choice(V.ID_NOUNS)])
            if r.random() < 0.4
            else r.choice(V.ID_NOUNS)
            for _ in range(120)
        )
    )
    ext = V.EXTENSIONS[language]
    dirs = [d.format(pkg=package) for d in V.SOURCE_DIRS[language]]
    sources = []
    for _ in range(r.randint(25, 220)):
        stem = r.choice(V.ID_NOUNS) + ("_" + r.choice(V.ID_NOUNS) if r.random() < 0.4 else "")
        if language == "typescript" and r.random() < 0.4:
            stem, file_ext = pascal(stem.split("_")), ".tsx"
        else:
            stem = stem if language != "typescript" else stem.replace("_", "-")
            file_ext = ext
        sources.append(f"{r.choice(dirs)}/{stem}{file_ext}")
    sources = list(dict.fromkeys(sources))
    r.shuffle(sources)  # rank = how often sessions touch the file
    test_dir = V.TEST_DIRS[language]
    tests = []
    for source in sources[: max(4, len(sources) // 3)]:
        stem = source.rsplit("/", 1)[1].rsplit(".", 1)[0]
        tests.append(
            {
                "python": f"{test_dir}/test_{stem}.py",
                "typescript": f"{test_dir}/{stem}.test.ts",
                "rust": f"{test_dir}/{stem}.rs",
                "go": f"{source.rsplit('.', 1)[0]}_test.go",
            }[language]
        )
    tests = list(dict.fromkeys(tests))
    others = list(V.PROJECT_FILES[language]) + [p for p in V.OTHER_FILES if r.random() < 0.6]
    commands = {
        "python": ("uv run pytest -q", "uv run python -m compileall -q src", "uv run ruff check ."),
        "typescript": ("npm test -- --run", "npm run build", "npx eslint . --max-warnings=0"),
        "rust": ("cargo test", "cargo build", "cargo clippy --all-targets -- -D warnings"),
        "go": ("go test ./...", "go build ./...", "golangci-lint run"),
    }[language]
    branches = ("main",) + tuple(
        f"{r.choice(('feat', 'fix', 'chore', 'refactor'))}/{r.choice(V.ID_NOUNS)}-{r.choice(V.ID_NOUNS)}"
        for _ in range(r.randint(2, 8))
    )
    project_tokens = [f"`{f}`" if r.random() < 0.6 else f for f in functions]
    project_tokens += [f"`{c}`" if r.random() < 0.5 else c for c in classes]
    r.shuffle(project_tokens)
    tokens = Zipf(
        (
            (V.PROSE, 0.6, 1.0),
            (TECHNICAL, 0.27, 1.05),
            (project_tokens, 0.09, 1.1),
            (sources + tests, 0.03, 1.1),
            ([name, package] + list(branches) + constants[:10], 0.01, 1.0),
        )
    )
    return Project(
        index=index,
        seed=hash_seed(seed, "project", index),
        name=name,
        package=package,
        cwd=cwd,
        language=language,
        branches=branches,
        sources=sources,
        tests=tests,
        others=others,
        functions=functions,
        classes=classes,
        constants=constants,
        variables=variables,
        test_command=commands[0],
        build_command=commands[1],
        lint_command=commands[2],
        tokens=tokens,
    )


# ----------------------------------------------------------------------------------------------
# Code


def _statement(p: Project, r: random.Random, depth: int, test: bool) -> list[str]:
    """One statement (or a small nested block) of the project's language, unindented."""
    f, c, v = r.choice(p.functions), r.choice(p.classes), r.choice(p.variables)
    v2 = r.choice(p.variables)
    lang = p.language
    roll = r.random()
    words = p.tokens
    if roll < 0.12:
        comment = " ".join(words.draw_few(r, r.randint(4, 12))).replace("`", "")
        return [{"python": "# ", "typescript": "// ", "rust": "// ", "go": "// "}[lang] + comment]
    if lang == "python":
        options = [
            f"{v} = {f}({v2}, {r.choice(p.variables)})",
            f"{v} = self.{f}({v2})",
            f'logger.debug("{f}: %s", {v})',
            f"return {v}",
            f"{v}: {r.choice(V.TYPE_NAMES['python'])} = {r.choice(p.constants)}",
            f"{v}.append({c}({v2}={v2}))",
            f"assert {v} == {r.randint(0, 500)}" if test else f"{v} = {v2} or {{}}",
        ]
        if depth < 2 and roll > 0.6:
            head = r.choice((f"if {v} is None:", f"for {v2} in {v}:", f"with {f}({v}) as {v2}:", "try:"))
            body = [line for _ in range(r.randint(1, 3)) for line in _statement(p, r, depth + 1, test)]
            block = [head] + ["    " + b for b in body]
            if head == "try:":
                block += [
                    f"except {r.choice(('KeyError', 'ValueError', 'OSError', c + 'Error'))} as exc:",
                    f'    raise {c}Error(f"{f} failed: {{exc}}") from exc',
                ]
            return block
    elif lang == "typescript":
        options = [
            f"const {v} = await {f}({v2});",
            f"const {v}: {r.choice(V.TYPE_NAMES['typescript'])} = {f}({v2}, {r.choice(p.variables)});",
            f"return {v};",
            f"{v}.push(new {c}({{ {v2} }}));",
            f"expect({v}).toEqual({r.randint(0, 500)});" if test else f'logger.info({{ {v} }}, "{f}");',
            f"set{v[:1].upper()}{v[1:]}(({v2}) => {v2});",
        ]
        if depth < 2 and roll > 0.6:
            head = r.choice((f"if (!{v}) {{", f"for (const {v2} of {v}) {{", "try {"))
            body = [line for _ in range(r.randint(1, 3)) for line in _statement(p, r, depth + 1, test)]
            tail = ["}"] if head != "try {" else ["} catch (err) {", f"  throw new {c}Error(String(err));", "}"]
            return [head] + ["  " + b for b in body] + tail
    elif lang == "rust":
        options = [
            f"let {v} = {f}(&{v2})?;",
            f"let mut {v}: {r.choice(V.TYPE_NAMES['rust'])} = {c}::new();",
            f"{v}.push({f}({v2}));",
            f'tracing::debug!(?{v}, "{f}");',
            f"assert_eq!({v}, {r.randint(0, 500)});" if test else f"return Ok({v});",
            f"let {v} = self.{f}({v2}).await?;",
        ]
        if depth < 2 and roll > 0.6:
            head = r.choice((f"if let Some({v2}) = {v} {{", f"for {v2} in {v}.iter() {{", f"match {v} {{"))
            body = [line for _ in range(r.randint(1, 3)) for line in _statement(p, r, depth + 1, test)]
            if head.startswith("match"):
                body = (
                    [f"{c}::{r.choice(V.ID_NOUNS).capitalize()} => {{"] + ["    " + b for b in body] + ["}", "_ => {}"]
                )
            return [head] + ["    " + b for b in body] + ["}"]
    else:
        options = [
            f"{v}, err := {f}(ctx, {v2})",
            'if err != nil {\n\treturn nil, fmt.Errorf("' + f + ': %w", err)\n}',
            f"{v} = append({v}, {c}{{{v2.capitalize()}: {v2}}})",
            f"require.Equal(t, {r.randint(0, 500)}, {v})" if test else f"return {v}, nil",
            f'log.Debug("{f}", zap.Any("{v}", {v}))',
        ]
        if depth < 2 and roll > 0.6:
            head = r.choice((f"if {v} == nil {{", f"for _, {v2} := range {v} {{"))
            body = [line for _ in range(r.randint(1, 3)) for line in _statement(p, r, depth + 1, test)]
            return [head] + ["\t" + b for b in body] + ["}"]
    return r.choice(options).split("\n")


def _function(p: Project, r: random.Random, test: bool) -> list[str]:
    f, c, v = r.choice(p.functions), r.choice(p.classes), r.choice(p.variables)
    types = V.TYPE_NAMES[p.language]
    body = [line for _ in range(r.randint(2, 14)) for line in _statement(p, r, 0, test)]
    if p.language == "python":
        name = "test_" + f if test else f
        head = [f"def {name}({v}: {r.choice(types)}, {r.choice(p.variables)}: {r.choice(types)} = None) -> {c}:"]
        if r.random() < 0.5:
            head.append(
                '    """' + " ".join(p.tokens.draw_few(r, r.randint(6, 16))).replace("`", "").capitalize() + '."""'
            )
        return head + ["    " + b for b in body] + [""]
    if p.language == "typescript":
        if test:
            return [f'it("{f.replace("_", " ")}", async () => {{'] + ["  " + b for b in body] + ["});", ""]
        return (
            [f"export async function {f}({v}: {r.choice(types)}): Promise<{c}> {{"]
            + ["  " + b for b in body]
            + ["}", ""]
        )
    if p.language == "rust":
        head = (
            ["#[test]", f"fn {f}() {{"]
            if test
            else [f"pub async fn {f}(&self, {v}: {r.choice(types)}) -> Result<{c}> {{"]
        )
        return head + ["    " + b for b in body] + ["}", ""]
    name = "Test" + f[:1].upper() + f[1:] if test else f
    head = (
        [f"func {name}(t *testing.T) {{"]
        if test
        else [f"func (s *{c}) {name}(ctx context.Context, {v} {r.choice(types)}) ({c}, error) {{"]
    )
    return head + ["\t" + b for line in body for b in line.split("\n")] + ["}", ""]


def code_file(p: Project, r: random.Random, test: bool) -> list[str]:
    """A source file: imports, then functions (and a class in Python), 20 to ~1,500 lines."""
    mods = V.MODULES[p.language]
    target = int(min(1500, max(20, r.lognormvariate(4.6, 0.8))))
    if p.language == "python":
        lines = [
            '"""' + " ".join(p.tokens.draw_few(r, 12)).replace("`", "").capitalize() + '."""',
            "",
            "from __future__ import annotations",
            "",
        ]
        lines += [f"import {m}" for m in sorted(set(r.sample(mods, 4)) | {"logging"})]
        lines += [
            f"from {p.package}.{r.choice(V.ID_NOUNS)} import {r.choice(p.classes)}, {r.choice(p.functions)}",
            "",
            "logger = logging.getLogger(__name__)",
            "",
        ]
    elif p.language == "typescript":
        lines = [f'import {{ {r.choice(p.functions)} }} from "{m}";' for m in r.sample(mods, 3)] + [""]
    elif p.language == "rust":
        lines = [f"use {m}::{{{r.choice(p.classes)}, {r.choice(p.functions)}}};" for m in r.sample(mods, 3)] + [""]
    else:
        lines = (
            [f"package {p.package.split('-')[0]}", "", "import ("]
            + [f'\t"{m}"' for m in sorted(r.sample(mods, 4))]
            + [")", ""]
        )
    while len(lines) < target:
        if p.language == "python" and not test and r.random() < 0.15:
            c = r.choice(p.classes)
            lines += [f"class {c}:", f"    {r.choice(p.variables)}: {r.choice(V.TYPE_NAMES['python'])}", ""]
            lines += ["    " + x if x else "" for x in _function(p, r, False)]
        else:
            lines += _function(p, r, test)
    return lines[:target] if len(lines) > target + 40 else lines


def doc_file(p: Project, r: random.Random, path: str) -> list[str]:
    """A README, changelog, config or CI file of the project."""
    rng = np.random.default_rng(r.getrandbits(32))
    if path.endswith(".md"):
        lines = [f"# {p.name}", ""]
        for _ in range(r.randint(3, 12)):
            lines += [f"## {' '.join(p.tokens.draw(rng, r.randint(1, 4))).replace('`', '').capitalize()}", ""]
            lines += [" ".join(p.tokens.draw(rng, r.randint(20, 70))).capitalize() + ".", ""]
            if r.random() < 0.4:
                lines += ["```sh", r.choice((p.test_command, p.build_command, p.lint_command)), "```", ""]
        return lines
    if path.endswith((".yml", ".yaml")):
        return [
            "name: ci",
            "on: [push, pull_request]",
            "jobs:",
            "  test:",
            "    runs-on: ubuntu-latest",
            "    steps:",
            "      - uses: actions/checkout@v4",
            f"      - run: {p.build_command}",
            f"      - run: {p.test_command}",
        ]
    if path.endswith(".toml"):
        return [
            "[package]" if p.language == "rust" else "[project]",
            f'name = "{p.package}"',
            f'version = "0.{r.randint(1, 30)}.{r.randint(0, 9)}"',
            "",
            "[dependencies]",
        ] + [f'{m.split("/")[0]} = "{r.randint(0, 4)}.{r.randint(0, 40)}"' for m in r.sample(V.MODULES[p.language], 6)]
    if path.endswith(".json"):
        return [
            "{",
            f'  "name": "{p.name}",',
            '  "private": true,',
            '  "scripts": {',
            f'    "build": "{p.build_command}",',
            '    "test": "vitest"',
            "  }",
            "}",
        ]
    return [" ".join(p.tokens.draw(rng, r.randint(4, 12))).replace("`", "") for _ in range(r.randint(5, 40))]


# ----------------------------------------------------------------------------------------------
# Per-session text


@dataclass
class Edit:
    """A change to a file: ``old`` lines (from line ``start``, 1-based) replaced by ``new``."""

    path: str
    start: int
    old: list[str]
    new: list[str]
    original: list[str]


class Texts:
    """The text source of one session: prose, prompts and tool outputs about its project."""

    def __init__(self, project: Project, seed: int):
        self.p = project
        self.r = random.Random(seed)
        self.n = np.random.default_rng(seed & 0xFFFFFFFFFFFFFFFF)

    # -- words and prose -----------------------------------------------------------------

    def words(self, n: int) -> list[str]:
        return self.p.tokens.draw(self.n, n)

    def prose(self, n_words: int) -> str:
        """Sentences of 5-24 words, about ``n_words`` in all."""
        words = self.words(max(n_words, 3))
        r = self.r
        out = []
        i = 0
        while i < len(words):
            k = r.randint(5, 24)
            sentence = words[i : i + k]
            i += k
            first = sentence[0]
            sentence[0] = first[:1].upper() + first[1:]
            end = "." if r.random() < 0.9 else r.choice(("?", ":", "!"))
            out.append(" ".join(sentence) + end)
        return " ".join(out)

    def paragraphs(self, n_words: int) -> str:
        parts = []
        left = n_words
        while left > 0:
            k = min(left, self.r.randint(25, 90))
            parts.append(self.prose(k))
            left -= k
        return "\n\n".join(parts)

    def title(self) -> str:
        return " ".join(self.words(self.r.randint(2, 5))).replace("`", "").capitalize()

    def path(self) -> str:
        """A file of the project, the often-touched ones more often."""
        paths = self.p.sources
        r = self.r
        if r.random() < 0.2 and self.p.tests:
            return r.choice(self.p.tests)
        if r.random() < 0.05:
            return r.choice(self.p.others)
        return paths[min(int(r.paretovariate(1.2)) - 1, len(paths) - 1)]

    def ident(self) -> str:
        fs = self.p.functions
        return fs[min(int(self.r.paretovariate(1.1)) - 1, len(fs) - 1)]

    def error(self, language: Optional[str] = None) -> str:
        r = self.r
        template = r.choice(V.ERRORS[language or self.p.language])
        return template.format(
            ident=self.ident(),
            arg=r.choice(self.p.variables),
            cls=r.choice(self.p.classes),
            path=self.path(),
            mod=r.choice(V.MODULES[self.p.language]),
            n=r.randint(1, 900),
            m=r.randint(1, 90),
            word=r.choice(self.p.functions).split("_")[0],
        )

    def prompt(self) -> str:
        r = self.r
        template = r.choice(V.PROMPT_TEMPLATES)
        text = template.format(
            verb=r.choice(V.PROMPT_OPENERS),
            thing=" ".join(self.words(r.randint(2, 6))),
            path=self.path(),
            sentence=self.prose(r.randint(6, 25)),
            noun=r.choice(V.ID_NOUNS),
            noun2=r.choice(V.ID_NOUNS),
            word2=r.choice(TECHNICAL),
            ident=self.ident(),
            error=self.error(),
        )
        if r.random() < 0.25:
            text += "\n\n" + self.paragraphs(r.randint(30, 200))
        if r.random() < 0.05:  # a pasted log
            text += "\n\n```\n" + self.log_lines(r.randint(10, 120)) + "\n```"
        return text

    def reasoning(self, long: bool = False) -> str:
        r = self.r
        body = self.paragraphs(r.randint(60, 400) if long else r.randint(15, 80))
        return f"**{self.title()}**\n\n{body}"

    def commentary(self) -> str:
        return self.prose(self.r.randint(8, 40))

    def answer(self) -> str:
        """A final answer: a summary, often bullets with file references, sometimes code."""
        r = self.r
        parts = [self.prose(r.randint(15, 60))]
        if r.random() < 0.7:
            bullets = [
                f"- `{self.path()}:{r.randint(1, 400)}` {self.prose(r.randint(8, 30))}"
                if r.random() < 0.5
                else f"- {self.prose(r.randint(8, 30))}"
                for _ in range(r.randint(2, 7))
            ]
            parts.append("\n".join(bullets))
        if r.random() < 0.25:
            lines = self.p.file_lines(self.path())
            start = r.randrange(max(1, len(lines) - 10))
            parts.append("```" + self.p.language + "\n" + "\n".join(lines[start : start + r.randint(3, 25)]) + "\n```")
        if r.random() < 0.5:
            parts.append(self.prose(r.randint(10, 40)))
        return "\n\n".join(parts)

    def plan(self) -> list[tuple[str, str]]:
        r = self.r
        n = r.randint(2, 7)
        done = r.randint(0, n - 1)
        return [
            (
                self.prose(r.randint(4, 12)).rstrip(".?:!"),
                "completed" if i < done else "in_progress" if i == done else "pending",
            )
            for i in range(n)
        ]

    # -- files -----------------------------------------------------------------------------

    def read_range(self, path: str) -> tuple[int, list[str], int]:
        """(first line, lines, total lines) of a file read: the whole file, or a window of a long one."""
        lines = self.p.file_lines(path)
        r = self.r
        if len(lines) <= 400 or r.random() < 0.3:
            return 1, lines[:2000], len(lines)
        start = r.randrange(len(lines) - 100)
        return start + 1, lines[start : start + r.randint(60, 300)], len(lines)

    def edit(self, path: str) -> Edit:
        lines = self.p.file_lines(path)
        r = self.r
        start = r.randrange(max(1, len(lines) - 8))
        old = lines[start : start + r.randint(1, 6)] or [""]
        indent = old[0][: len(old[0]) - len(old[0].lstrip())]
        new = [indent + s for _ in range(r.randint(1, 5)) for s in _statement(self.p, r, 1, path in self.p.tests)]
        return Edit(path, start + 1, old, new, lines)

    def new_file(self) -> tuple[str, list[str]]:
        r = self.r
        base = self.path()
        directory = base.rsplit("/", 1)[0] if "/" in base else "src"
        ext = "." + base.rsplit(".", 1)[1] if "." in base else V.EXTENSIONS[self.p.language]
        path = f"{directory}/{r.choice(V.ID_NOUNS)}_{r.choice(V.ID_NOUNS)}{ext}"
        return path, code_file(self.p, random.Random(r.getrandbits(64)), test="test" in directory)

    # -- command outputs -------------------------------------------------------------------

    def log_lines(self, n: int) -> str:
        r = self.r
        ms = 1_760_000_000_000 + r.randrange(10**10)
        out = []
        for _ in range(n):
            ms += r.randrange(1, 5000)
            level = r.choices(("INFO", "DEBUG", "WARN", "ERROR"), (6, 3, 1, 0.5))[0]
            msg = self.error() if level == "ERROR" else self.prose(r.randint(4, 14))
            out.append(f"{iso_ms(ms)} {level:5s} {self.p.package}::{r.choice(V.ID_NOUNS)}: {msg}")
        return "\n".join(out)

    def test_run(self, fail: bool) -> tuple[str, str, int]:
        """(command, output, exit code) of the project's test suite."""
        p, r = self.p, self.r
        tests = [
            (t, self.ident())
            for t in r.sample(p.tests, min(len(p.tests), r.randint(2, 12)))
            for _ in range(r.randint(1, 6))
        ]
        failed = set(r.sample(range(len(tests)), min(len(tests), r.randint(1, 3)))) if fail else set()
        seconds = r.uniform(0.2, 40)
        lines: list[str] = []
        if p.language == "python":
            lines += [
                "============================= test session starts ==============================",
                f"platform linux -- Python 3.12.{r.randint(0, 9)}, pytest-8.3.{r.randint(0, 5)}, pluggy-1.5.0",
                f"rootdir: {p.cwd}",
                "configfile: pyproject.toml",
                f"collected {len(tests)} items",
                "",
            ]
            by_file: dict[str, str] = {}
            for i, (t, _) in enumerate(tests):
                by_file[t] = by_file.get(t, "") + ("F" if i in failed else ".")
            lines += [
                f"{t} {marks:<40s} [{100 * (k + 1) // len(by_file):3d}%]"
                for k, (t, marks) in enumerate(by_file.items())
            ]
            if failed:
                lines += ["", "=================================== FAILURES ==================================="]
                for i in sorted(failed):
                    t, name = tests[i]
                    lines += [f"_________________________________ test_{name} _________________________________", ""]
                    lines += ["    " + x for x in self.p.file_lines(t)[: r.randint(3, 12)]]
                    err = self.error("python")
                    lines += [
                        f">       assert {r.choice(p.variables)} == {r.randint(0, 99)}",
                        f"E       {err}",
                        "",
                        f"{t}:{r.randint(10, 400)}: {err.split(':')[0]}",
                    ]
                lines += ["=========================== short test summary info ============================"]
                lines += [f"FAILED {tests[i][0]}::test_{tests[i][1]} - {self.error('python')}" for i in sorted(failed)]
            passed = len(tests) - len(failed)
            summary = (f"{len(failed)} failed, " if failed else "") + f"{passed} passed"
            lines.append(f"======================== {summary} in {seconds:.2f}s ========================")
        elif p.language == "typescript":
            for t in dict.fromkeys(t for t, _ in tests):
                bad = any(tests[i][0] == t for i in failed)
                lines.append(f" {'FAIL' if bad else 'PASS'}  {t}")
            for i in sorted(failed):
                t, name = tests[i]
                lines += [
                    "",
                    f"  ● {r.choice(p.classes)} › {name.replace('_', ' ')}",
                    "",
                    "    expect(received).toEqual(expected) // deep equality",
                    "",
                    f"    Expected: {r.randint(0, 99)}",
                    f"    Received: {r.randint(0, 99)}",
                    "",
                    f"      at Object.<anonymous> ({t}:{r.randint(5, 300)}:{r.randint(2, 40)})",
                ]
            lines += [
                "",
                f"Test Files  {len(failed)} failed | {len(set(t for t, _ in tests))} total"
                if failed
                else f"Test Files  {len(set(t for t, _ in tests))} passed",
                f"     Tests  {len(failed)} failed | {len(tests) - len(failed)} passed ({len(tests)})",
                f"  Duration  {seconds:.2f}s",
            ]
        elif p.language == "rust":
            lines += [
                f"   Compiling {p.package} v0.{r.randint(1, 20)}.{r.randint(0, 9)} ({p.cwd})",
                f"    Finished `test` profile [unoptimized + debuginfo] target(s) in {r.uniform(1, 90):.2f}s",
                f"     Running unittests src/lib.rs (target/debug/deps/{p.package}-{r.getrandbits(64):016x})",
                "",
                f"running {len(tests)} tests",
            ]
            lines += [
                f"test {t.rsplit('/', 1)[1][:-3]}::tests::{name} ... {'FAILED' if i in failed else 'ok'}"
                for i, (t, name) in enumerate(tests)
            ]
            if failed:
                lines += ["", "failures:", ""]
                for i in sorted(failed):
                    lines += [f"---- tests::{tests[i][1]} stdout ----", self.error("rust"), ""]
            lines.append(
                f"test result: {'FAILED' if failed else 'ok'}. {len(tests) - len(failed)} passed; "
                f"{len(failed)} failed; 0 ignored; 0 measured; 0 filtered out; finished in {seconds:.2f}s"
            )
        else:
            for i, (t, name) in enumerate(tests):
                test_name = "Test" + name[:1].upper() + name[1:]
                lines += [f"=== RUN   {test_name}"]
                if i in failed:
                    lines += [
                        f"    {t.rsplit('/', 1)[1]}:{r.randint(10, 300)}: {self.error('go')}",
                        f"--- FAIL: {test_name} ({r.uniform(0, 2):.2f}s)",
                    ]
                else:
                    lines += [f"--- PASS: {test_name} ({r.uniform(0, 2):.2f}s)"]
            module = f"github.com/{p.package}/{p.name}"
            lines += [
                "FAIL" if failed else "PASS",
                f"{'FAIL' if failed else 'ok  '}\t{module}/internal/api\t{seconds:.3f}s",
            ]
        return p.test_command, "\n".join(lines), 1 if failed else 0

    def build_run(self, fail: bool) -> tuple[str, str, int]:
        p, r = self.p, self.r
        if not fail:
            out = {
                "python": "",
                "typescript": f"vite v5.4.{r.randint(0, 9)} building for production...\n"
                f"✓ {r.randint(100, 2000)} modules transformed.\ndist/index.html  0.46 kB\n"
                f"dist/assets/index-{r.getrandbits(32):08x}.js  {r.randint(100, 900)}.{r.randint(0, 99)} kB",
                "rust": f"   Compiling {p.package} v0.1.0 ({p.cwd})\n    Finished `dev` profile "
                f"[unoptimized + debuginfo] target(s) in {r.uniform(1, 60):.2f}s",
                "go": "",
            }[p.language]
            return p.build_command, out, 0
        errors = []
        for _ in range(r.randint(1, 4)):
            path, line = self.path(), r.randint(1, 400)
            if p.language == "rust":
                errors.append(
                    f"{self.error('rust')}\n  --> {path}:{line}:{r.randint(1, 60)}\n   |\n{line:>3} | "
                    f"{r.choice(p.file_lines(path)).strip()}\n   |     ^^^^^^"
                )
            elif p.language == "typescript":
                errors.append(f"{path}({line},{r.randint(1, 60)}): {self.error('typescript')}")
            elif p.language == "go":
                errors.append(f"./{path}:{line}:{r.randint(1, 60)}: {self.error('go')}")
            else:
                errors.append(
                    f"*** Error compiling '{path}'...\n  File \"{path}\", line {line}\n    "
                    f"{r.choice(p.file_lines(path)).strip()}\nSyntaxError: invalid syntax"
                )
        return p.build_command, "\n\n".join(errors), r.choice((1, 2, 101))

    def lint_run(self) -> tuple[str, str, int]:
        p, r = self.p, self.r
        if r.random() < 0.4:
            return p.lint_command, "All checks passed!" if p.language == "python" else "", 0
        lines = []
        for _ in range(r.randint(1, 25)):
            path, line, col = self.path(), r.randint(1, 500), r.randint(1, 80)
            rule = {
                "python": r.choice(("F401", "E501", "B008", "UP007", "SIM108", "F841")),
                "typescript": r.choice(
                    ("no-unused-vars", "react-hooks/exhaustive-deps", "@typescript-eslint/no-explicit-any")
                ),
                "rust": r.choice(("clippy::needless_borrow", "clippy::redundant_clone", "clippy::too_many_arguments")),
                "go": r.choice(("errcheck", "ineffassign", "staticcheck", "unused")),
            }[p.language]
            lines.append(f"{path}:{line}:{col}: {rule} {self.prose(r.randint(4, 10))}")
        return p.lint_command, "\n".join(lines) + f"\nFound {len(lines)} errors.", 1

    def git_status(self) -> tuple[str, str, int]:
        r = self.r
        changed = [f"\tmodified:   {self.path()}" for _ in range(r.randint(0, 8))]
        out = f"On branch {r.choice(self.p.branches)}\n"
        out += (
            (
                'Changes not staged for commit:\n  (use "git add <file>..." to update what will be committed)\n'
                + "\n".join(changed)
                + "\n"
            )
            if changed
            else "nothing to commit, working tree clean\n"
        )
        return "git status", out, 0

    def git_log(self) -> tuple[str, str, int]:
        r = self.r
        lines = [
            f"{r.getrandbits(28):07x} {self.prose(r.randint(4, 12)).rstrip('.?:!')}" for _ in range(r.randint(5, 30))
        ]
        return f"git log --oneline -{len(lines)}", "\n".join(lines), 0

    def git_diff(self) -> tuple[str, str, int]:
        edits = [self.edit(self.path()) for _ in range(self.r.randint(1, 5))]
        return "git diff", "\n".join(unified_diff(e, self.r) for e in edits), 0

    def listing(self) -> tuple[str, str, int]:
        r = self.r
        base = r.choice(self.p.sources).rsplit("/", 1)[0]
        names = sorted({p.rsplit("/", 1)[1] for p in self.p.sources if p.startswith(base + "/")})
        out = [f"total {len(names) * 8}"] + [
            f"-rw-r--r--  1 dev dev {r.randint(200, 60000):6d} {r.choice(('Jan', 'Feb', 'Mar', 'Oct', 'Nov'))} "
            f"{r.randint(1, 28):2d} {r.randint(0, 23):02d}:{r.randint(0, 59):02d} {n}"
            for n in names
        ]
        return f"ls -la {base}", "\n".join(out), 0

    def grep(self) -> tuple[str, list[str], list[str]]:
        """(pattern, matching lines as ``path:line:text``, matching files)."""
        r = self.r
        path = self.path()
        lines = self.p.file_lines(path)
        words = [
            w
            for w in r.choice(lines).replace("(", " ").replace(")", " ").replace(".", " ").split()
            if w.isidentifier() and len(w) > 3
        ] or [self.ident()]
        pattern = r.choice(words)
        matches, files = [], []
        for candidate in dict.fromkeys([path] + [self.path() for _ in range(r.randint(2, 12))]):
            hits = [
                f"{candidate}:{i + 1}:{text}" for i, text in enumerate(self.p.file_lines(candidate)) if pattern in text
            ]
            if hits:
                files.append(candidate)
                matches.extend(hits[:50])
        return pattern, matches, files

    def shell(self) -> tuple[str, str, int]:
        """Some other command an agent runs, with its output and exit code."""
        r = self.r
        roll = r.random()
        if roll < 0.2:
            return self.git_status()
        if roll < 0.3:
            return self.git_log()
        if roll < 0.42:
            return self.git_diff()
        if roll < 0.52:
            return self.listing()
        if roll < 0.62:
            return self.lint_run()
        if roll < 0.7:
            return self.build_run(r.random() < 0.3)
        if roll < 0.78:
            n = r.randint(20, 400)
            return f"tail -n {n} logs/{self.p.package}.log", self.log_lines(n), 0
        if roll < 0.84:
            err = self.error("shell")
            return (
                f"{r.choice(('make', 'git', 'npm', 'curl', 'docker'))} {r.choice(V.ID_VERBS)}",
                err,
                r.choice((1, 2, 127)),
            )
        if roll < 0.9:
            items = ", ".join(f'"{r.choice(self.p.variables)}": {r.randint(0, 9999)}' for _ in range(r.randint(2, 30)))
            return f"curl -s localhost:{r.randint(3000, 9000)}/api/{r.choice(V.ID_NOUNS)}s", "{" + items + "}", 0
        path = self.path()
        lines = self.p.file_lines(path)
        return f"wc -l {path}", f"{len(lines)} {path}", 0


def unified_diff(e: Edit, r: random.Random) -> str:
    """``git diff`` text of an edit, with three lines of context."""
    before = e.original[max(0, e.start - 4) : e.start - 1]
    after = e.original[e.start - 1 + len(e.old) : e.start - 1 + len(e.old) + 3]
    first = e.start - len(before)
    head = [
        f"diff --git a/{e.path} b/{e.path}",
        f"index {r.getrandbits(28):07x}..{r.getrandbits(28):07x} 100644",
        f"--- a/{e.path}",
        f"+++ b/{e.path}",
        f"@@ -{first},{len(before) + len(e.old) + len(after)} +{first},{len(before) + len(e.new) + len(after)} @@",
    ]
    return "\n".join(
        head
        + [" " + x for x in before]
        + ["-" + x for x in e.old]
        + ["+" + x for x in e.new]
        + [" " + x for x in after]
    )


def codex_patch(e: Edit) -> str:
    """The edit in Codex's ``apply_patch`` format."""
    context = e.original[e.start - 2] if e.start >= 2 else ""
    return "\n".join(
        ["*** Begin Patch", f"*** Update File: {e.path}", f"@@ {context}".rstrip()]
        + ["-" + x for x in e.old]
        + ["+" + x for x in e.new]
        + ["*** End Patch"]
    )


def codex_add_patch(path: str, lines: list[str]) -> str:
    return "\n".join(["*** Begin Patch", f"*** Add File: {path}"] + ["+" + x for x in lines] + ["*** End Patch"])
