"""A command's refusal as users must see it: exit 2 and one `error:` line naming what was wrong."""

from __future__ import annotations


def assert_one_error_line(result, *words: str) -> None:
    """`result` (typer's CliRunner) exited 2 with a single `error: ...` line, no traceback, holding every word."""
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert line.startswith("error: ") and "\n" not in line and "Traceback" not in line, line
    for word in words:
        assert word in line, line
