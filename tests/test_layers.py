"""The package layering the design asks for, read from the source with `ast` (imports anywhere in a file count:
inside functions and under `if TYPE_CHECKING:` too; tests/import_graph.py)."""

from __future__ import annotations

import ast

from import_graph import ROOT, describe_cycles, import_sites


def imported_packages(package: str) -> dict[str, set[str]]:
    """For each top-level turnforge package imported from `package`, the files that import it."""
    out: dict[str, set[str]] = {}
    for site in import_sites():
        if site.source == package:
            out.setdefault(site.target, set()).add(site.file)
    return out


def test_no_import_cycle_between_top_level_packages():
    """Each top-level package (`turnforge.X`) can be read knowing only those below it: no two reach each other.
    A failure lists every import on a cycle, `importer -> imported  file:line`."""
    cycles = describe_cycles(import_sites())
    assert not cycles, "import cycles between top-level packages:\n" + "\n".join(cycles)


def test_envs_do_not_import_eval():
    assert "eval" not in imported_packages("envs"), imported_packages("envs")["eval"]


TRL_PRIVATE = {"_get_per_token_logps_and_entropies", "_generate_and_score_completions", "_total_train_tokens",
               "_metrics", "_original_forward", "getclosurevars", "_tokenizer"}


def test_trl_internals_are_reached_from_one_module_only():
    """Every use of a TRL / accelerate private name is in `train/trl_internals.py`, where each is checked."""
    found = []
    for path in ROOT.rglob("*.py"):
        if path.name == "trl_internals.py":
            continue
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            name = node.attr if isinstance(node, ast.Attribute) else node.value if isinstance(node, ast.Constant) else None
            if name in TRL_PRIVATE:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert found == []


def test_envs_do_not_import_policies():
    """An env reaches its model roles (a user simulator, a judge) through the call types in `turnforge.types`, and
    is served unchanged over OpenEnv: it imports no policy (design §3)."""
    assert "policies" not in imported_packages("envs"), imported_packages("envs")["policies"]
