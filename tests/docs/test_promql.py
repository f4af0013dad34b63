"""The docs' PromQL works when copied from the raw markdown (issue 28: a
query in a table cell, its `|` escaped as `\\|` for the table, failed in
Prometheus with "unknown escape sequence U+007C").

The check is a small PromQL lexer, not Prometheus's parser: string literals
with Go's escapes (what Prometheus accepts), brackets balanced and nested,
no stray backslash, and every ``ringo_*`` metric one the daemon exports.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
METRICS_SOURCE = ROOT / "ringo_trio" / "server" / "http" / "metrics.py"

# Go's escapes in an interpreted string literal, which PromQL strings use.
_ESCAPE = re.compile(
    r"\\(?:[abfnrtv\\'\"]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[0-7]{3})"
)
_PAIRS = {")": "(", "]": "[", "}": "{"}
_SUFFIXES = ("_total", "_bucket", "_sum", "_count")


class PromQLError(ValueError):
    pass


def daemon_metric_names() -> set[str]:
    """The metric families the daemon defines (their names in metrics.py)."""
    return set(re.findall(r'"(ringo_[a-z_]+)"', METRICS_SOURCE.read_text()))


def check_promql(query: str, metrics: set[str]) -> None:
    """Raise PromQLError if ``query`` would not parse (as far as this lexer
    sees) or names a ``ringo_*`` metric the daemon does not export."""
    stack: list[str] = []
    outside: list[str] = []
    i = 0
    while i < len(query):
        c = query[i]
        if c in "\"'":
            end = i + 1
            while end < len(query) and query[end] != c:
                if query[end] == "\\":
                    escape = _ESCAPE.match(query, end)
                    if escape is None:
                        bad = query[end + 1 : end + 2]
                        raise PromQLError(
                            f"unknown escape sequence U+{ord(bad or chr(0)):04X} in {query!r}"
                        )
                    end = escape.end()
                else:
                    end += 1
            if end >= len(query):
                raise PromQLError(f"unterminated string in {query!r}")
            i = end + 1
            outside.append(" ")
            continue
        if c == "`":
            end = query.find("`", i + 1)
            if end < 0:
                raise PromQLError(f"unterminated raw string in {query!r}")
            i = end + 1
            continue
        if c == "\\":
            raise PromQLError(f"a backslash outside a string in {query!r}")
        if c in "([{":
            stack.append(c)
        elif c in _PAIRS and (not stack or stack.pop() != _PAIRS[c]):
            raise PromQLError(f"unbalanced {c!r} in {query!r}")
        outside.append(c)
        i += 1
    if stack:
        raise PromQLError(f"unclosed {stack[-1]!r} in {query!r}")
    for name in re.findall(r"\bringo_[a-z_]+\b", "".join(outside)):
        base = next((name[: -len(s)] for s in _SUFFIXES if name.endswith(s)), name)
        if name not in metrics and base not in metrics:
            raise PromQLError(
                f"no metric {name!r} in the daemon (ringo_trio/server/http/metrics.py)"
            )


def promql_queries() -> list[tuple[str, str]]:
    """(where, query) of every query in a ```promql block: one per line,
    ``#`` lines being comments."""
    found = []
    for doc in DOCS:
        text = doc.read_text()
        for block in re.finditer(r"```promql\n(.*?)```", text, flags=re.S):
            first = text[: block.start()].count("\n") + 2
            for offset, line in enumerate(block.group(1).splitlines()):
                if line.strip() and not line.lstrip().startswith("#"):
                    found.append((f"{doc.name}:{first + offset}", line.strip()))
    return found


def test_the_docs_have_promql_blocks() -> None:
    """Property: the Grafana queries are in promql blocks (so the checks
    below see them): at least the fifteen panels of docs/operations.md."""
    assert len([w for w, _ in promql_queries() if w.startswith("operations.md")]) >= 15


@pytest.mark.parametrize(("where", "query"), promql_queries(), ids=lambda v: v)
def test_every_promql_query_of_the_docs_parses(where: str, query: str) -> None:
    """Property: each query, copied as it stands in the raw markdown, has
    valid string escapes, balanced brackets and only the daemon's metrics."""
    check_promql(query, daemon_metric_names())


def test_the_checker_catches_the_escaped_bar() -> None:
    """Property: the lexer refuses what Prometheus refused (the escaped bar
    a table cell needs), a misspelt metric and unbalanced brackets, and
    accepts the same query written right."""
    metrics = daemon_metric_names()
    good = 'sum(rate(ringo_rpc_seconds_bucket{method!~"Work|Watch"}[5m]))'
    check_promql(good, metrics)
    with pytest.raises(PromQLError, match=r"U\+007C"):
        check_promql(good.replace("|", "\\|"), metrics)
    with pytest.raises(PromQLError, match="no metric"):
        check_promql("rate(ringo_tasks_akced_total[5m])", metrics)
    with pytest.raises(PromQLError, match="unclosed"):
        check_promql("sum(rate(ringo_tasks_acked_total[5m])", metrics)


def test_no_code_span_in_a_table_needs_an_escape() -> None:
    """Property: no code span in a markdown table holds a backslash escape:
    GitHub renders `a\\|b` in a cell as `a|b`, but whoever copies the raw
    markdown (an editor, a terminal, a diff) gets the backslash too. Such
    code goes into a code block under the table."""
    offenders = []
    for doc in DOCS:
        fenced = False
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            if fenced or not line.lstrip().startswith("|"):
                continue
            if "\\|" in line:
                offenders.append(f"{doc.name}:{number}: {line[:80]}")
    assert not offenders, "\n".join(offenders)
