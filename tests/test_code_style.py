"""What ruff does not check: the code says why, and the figures live in the docs.

A docstring or comment that quotes a time ("30 us", "2.5 ms", "250 tokens/s") states one
host's measurement as if it were a property of the code; it goes stale on the next host.  The
figures belong in docs/performance.md and benchmarks/results/.  And ruff's skip comment is kept
for tables whose alignment is their content, at most ten.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "aiayn"
TIMING = re.compile(
    r"\b\d+(?:\.\d+)?\s?(?:ns|us|µs|ms|GFLOP/s|GB/s|tok/s|tokens/s|sentences/s)(?![\w/])"
)


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of ``path``."""
    source = path.read_text()
    found = [
        (tok.start[0], tok.string)
        for tok in tokenize.generate_tokens(io.StringIO(source).readline)
        if tok.type == tokenize.COMMENT
    ]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc and node.body:
                found.append((node.body[0].lineno, doc))
    return found


def test_no_docstring_or_comment_quotes_a_timing() -> None:
    quoted = [
        f"{path.relative_to(ROOT)}:{line}: {match.group(0)!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line, text in _prose(path)
        for match in TIMING.finditer(text)
    ]
    assert not quoted, "timings belong in docs/performance.md:\n" + "\n".join(quoted)


def test_fmt_skip_is_kept_for_at_most_ten_alignment_tables() -> None:
    skips = [
        f"{path.relative_to(ROOT)}:{n}"
        for folder in ("aiayn", "tests", "benchmarks")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"#.*\bfmt: *(skip|off)\b", line)
    ]
    assert len(skips) <= 10, "\n".join(skips)


def test_no_module_is_over_500_lines() -> None:
    # one concept a file: past this a module holds two, and is split
    long = {
        str(path.relative_to(ROOT)): n
        for path in sorted(PACKAGE.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > 500
    }
    assert not long, long
