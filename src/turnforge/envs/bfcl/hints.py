"""Actionable hints for failed BFCL calls (Environment Tuning, `hints=True`).

A hint is built only from (a) the failed call the model wrote, (b) the error the executable class or
Python gave, (c) the function docs shown to the model and (d) the state of the model's OWN instances
(e.g. its current directory, which `pwd`/`ls` would show). It never reads the entry's ground truth, so it
names a missing prerequisite or parameter without revealing the expected calls (tests pin both).

    cd(folder='reports')     -> "cd: reports: No such directory ..." ->
        "Hint: there is no folder 'reports' in the current directory /workspace/document (it holds: temp/,
         final_report.pdf). cd takes one folder name at a time, not a path; use ls or find to look around."
"""

from __future__ import annotations

import difflib
import re
from typing import Any

from turnforge.envs.bfcl.execution import CallOutcome

_MISSING = re.compile(r"missing \d+ required (?:positional|keyword-only) arguments?: (?P<names>.+)$")
_UNEXPECTED = re.compile(r"got an unexpected keyword argument '(?P<name>[^']+)'")
_AUTH = re.compile(r"not authenticated|log in|logged in|access token|token (?:expired|not initialized)", re.I)
_NOT_FOUND = re.compile(r"no such (?:file or )?directory", re.I)
_PATH_REFUSED = re.compile(r"invalid character|path", re.I)  # the file system takes names, never paths
_LOGIN_WORDS = ("login", "authenticate")


def _signature(doc: dict[str, Any]) -> str:
    """`name(a: string, b: integer = optional)` from a BFCL function doc."""
    params = doc.get("parameters", {})
    required = set(params.get("required", []))
    parts = []
    for pname, spec in params.get("properties", {}).items():
        suffix = "" if pname in required else " (optional)"
        parts.append(f"{pname}: {spec.get('type', 'any')}{suffix}")
    return f"{doc['name']}({', '.join(parts)})"


def _param_text(doc: dict[str, Any], pname: str) -> str:
    spec = doc.get("parameters", {}).get("properties", {}).get(pname, {})
    description = spec.get("description", "").strip()
    return f"`{pname}` ({spec.get('type', 'any')}){': ' + description if description else ''}"


def _owner_docs(name: str, docs_by_class: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The docs of the class that owns function `name` (empty when no class has it)."""
    for docs in docs_by_class.values():
        if any(d["name"] == name for d in docs):
            return docs
    return []


def _unknown_function(name: str, docs: dict[str, dict[str, Any]]) -> str:
    close = difflib.get_close_matches(name, list(docs), n=3)
    guess = f" Did you mean {', '.join(f'`{c}`' for c in close)}?" if close else ""
    return f"there is no function `{name}`.{guess} Call only the functions listed to you."


def _signature_error(outcome: CallOutcome, doc: dict[str, Any]) -> str | None:
    """Hints for calls the method could not accept (missing / unknown parameters)."""
    message = outcome.error or ""
    missing = _MISSING.search(message)
    if missing:
        names = re.findall(r"'([^']+)'", missing.group("names"))
        needed = "; ".join(_param_text(doc, n) for n in names)
        return f"`{doc['name']}` needs the parameter{'s' if len(names) > 1 else ''} {needed}. Signature: {_signature(doc)}."
    unexpected = _UNEXPECTED.search(message)
    if unexpected:
        return (
            f"`{doc['name']}` has no parameter `{unexpected.group('name')}`. Signature: {_signature(doc)}."
        )
    return None


def _login_hint(owner: list[dict[str, Any]]) -> str | None:
    logins = [d for d in owner if any(w in d["name"].lower() for w in _LOGIN_WORDS) and "status" not in d["name"]]
    if not logins:
        return None
    return f"log in first: call {' or '.join(_signature(d) for d in logins)}, then retry."


def _directory_hint(outcome: CallOutcome, instances: dict[str, Any]) -> str | None:
    """Where the model's own file system stands, for "No such file or directory" errors."""
    fs = instances.get("GorillaFileSystem")
    current = getattr(fs, "_current_dir", None)
    if current is None:
        return None
    listing = ", ".join(
        f"{name}/" if type(item).__name__ == "Directory" else name for name, item in list(current.contents.items())[:20]
    )
    where = fs.pwd().get("current_working_directory", current.name)  # read-only, as the model's pwd() would be
    return (
        f"it is not in the current directory {where} (which holds: {listing or 'nothing'}). "
        "Paths are not accepted: cd into the folder that holds it first, one folder per cd "
        "(cd(folder='..') goes up); ls and find show what is where."
    )


def hint_for(
    outcome: CallOutcome,
    docs: dict[str, dict[str, Any]],
    docs_by_class: dict[str, list[dict[str, Any]]],
    instances: dict[str, Any],
) -> str | None:
    """The hint for one failed call (None when the call did not fail).

    `docs` are the function docs the model can see, by name; `docs_by_class` all docs of the entry's
    classes (to find a class's login function); `instances` are the model's own instances.
    """
    if outcome.error is None:
        return None
    name = outcome.call.name
    doc = docs.get(name)
    if doc is None:
        return _unknown_function(name, docs)
    if outcome.raised:
        fix = _signature_error(outcome, doc)
        if fix:
            return fix
    if _AUTH.search(outcome.error):
        login = _login_hint(_owner_docs(name, docs_by_class))
        if login:
            return login
    gave_path = any(isinstance(v, str) and "/" in v for v in outcome.call.arguments.values())
    if _NOT_FOUND.search(outcome.error) or (gave_path and _PATH_REFUSED.search(outcome.error)):
        where = _directory_hint(outcome, instances)
        if where:
            return where
    return f"`{name}` failed ({outcome.error}). Check the arguments against its signature: {_signature(doc)}."
