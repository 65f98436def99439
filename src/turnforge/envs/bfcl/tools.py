"""Function docs as the model sees them: BFCL docs per turn (miss_func holdouts) and tool JSON schemas.

BFCL loads the docs of every involved class (in `involved_classes` order), removes the miss_func
holdout functions, and adds them back at their turn (`_llm_response_generation.
populate_test_cases_with_predefined_functions`); every description gets " Note that the provided
function is in Python 3 syntax." (`func_doc_language_specific_pre_processing`).
"""

from __future__ import annotations

import copy
from typing import Any

from turnforge.envs.bfcl.data import PINNED_VERSION, function_docs

PYTHON_NOTE = " Note that the provided function is in Python 3 syntax."

# bfcl_eval.constants.type_mappings.GORILLA_TO_OPENAPI (the subset multi-turn docs use), restated because
# BFCL's converter module imports tenacity and tree-sitter parsers that the multi-turn classes do not need.
_OPENAPI_TYPES = {
    "integer": "integer",
    "number": "number",
    "float": "number",
    "string": "string",
    "boolean": "boolean",
    "bool": "boolean",
    "array": "array",
    "list": "array",
    "dict": "object",
    "object": "object",
    "tuple": "array",
    "any": "string",
}


def entry_docs(entry: dict[str, Any], version: str = PINNED_VERSION) -> tuple[list[dict], dict[int, list[dict]]]:
    """(docs visible from turn 0, {turn index: docs added back at that turn}) for one entry."""
    docs = []
    for class_name in entry["involved_classes"]:
        for doc in function_docs(class_name, version):
            doc = copy.deepcopy(doc)
            doc["description"] += PYTHON_NOTE
            docs.append(doc)
    held_out: dict[int, list[dict]] = {}
    for turn, names in entry.get("missed_function", {}).items():
        held_out[int(turn)] = [d for d in docs if d["name"] in names]
        docs = [d for d in docs if d["name"] not in names]
    return docs, held_out


def docs_by_class(entry: dict[str, Any], version: str = PINNED_VERSION) -> dict[str, list[dict]]:
    """All docs of the entry's classes, by class (hints look up a class's login function here)."""
    return {c: list(function_docs(c, version)) for c in entry["involved_classes"]}


def _openapi(schema: dict[str, Any]) -> dict[str, Any]:
    """One BFCL parameter schema with its types mapped to JSON Schema, recursively."""
    out = dict(schema)
    out["type"] = _OPENAPI_TYPES.get(str(schema.get("type", "string")), "string")
    if isinstance(schema.get("properties"), dict):
        out["properties"] = {k: _openapi(v) for k, v in schema["properties"].items()}
    if isinstance(schema.get("items"), dict):
        out["items"] = _openapi(schema["items"])
    return out


def tool_schema(doc: dict[str, Any]) -> dict[str, Any]:
    """A BFCL function doc as an OpenAI / Hugging Face tool (`{"type": "function", "function": ...}`)."""
    parameters = _openapi(doc.get("parameters", {"type": "dict", "properties": {}}))
    parameters["type"] = "object"
    function = {"name": doc["name"], "description": doc.get("description", ""), "parameters": parameters}
    return {"type": "function", "function": function}
