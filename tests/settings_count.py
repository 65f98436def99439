"""Count, under src/turnforge: (1) settings classes, (2) sampling-field declarations, (3) env-option coercion calls.

(1) a class in train/settings.py, stages/, types.py or policies/serve.py whose name ends in Settings, Params,
    Stage, StageBase, StageConfig, Phase, Filter, PlaysEnv, Table or Request (not SettingsError), plus every
    with_settings_fields(...) call there (each builds one more class with pydantic create_model at import).
    Classes without bases or decorator (a policy named ...Settings) are not settings.
(2) in any class that declares temperature or two of the group (temperature, top_p, top_k, max_new_tokens, stop),
    each of those and seed it declares; in any function with two or more of the group as parameters (a CLI
    command), each of them; and any teacher_temperature / teacher_max_new_tokens field (a renamed copy).
(3) calls of EnvSpec.coerce_options / _coerce.
"""
import ast
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "src/turnforge")
GROUP = {"temperature", "top_p", "top_k", "max_new_tokens", "stop"}
ALIASES = {"teacher_temperature", "teacher_max_new_tokens"}
MODULES = ("train/settings.py", "stages/", "types.py", "policies/serve.py")
NAME = re.compile(r"(Settings|Params|Stage|StageBase|StageConfig|Phase|Filter|PlaysEnv|Table|Request)$")
classes, sampling, coerce = [], [], []
for path in sorted(root.rglob("*.py")):
    rel = path.relative_to(root).as_posix()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            fields = [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
            if rel.startswith(MODULES) and NAME.search(node.name) and (node.bases or node.decorator_list):
                classes.append(f"{rel}:{node.name}")
            group = [f for f in fields if f in GROUP]
            if "temperature" in group or len(group) >= 2:
                sampling += [f"{rel}:{node.name}.{f}" for f in fields if f in GROUP | {"seed"}]
            sampling += [f"{rel}:{node.name}.{f}" for f in fields if f in ALIASES]
        elif isinstance(node, ast.Call):
            func = ast.unparse(node.func)
            if func.endswith("with_settings_fields") and rel.startswith(MODULES):
                classes.append(f"{rel}:{func}@{node.lineno}")
            if func.endswith(("coerce_options", "_coerce")):
                coerce.append(f"{rel}:{node.lineno}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = [a.arg for a in node.args.args + node.args.kwonlyargs if a.arg in GROUP]
            if len(params) >= 2:
                sampling += [f"{rel}:{node.name}({p})" for p in params]
places = sorted({re.split(r"[.(]", s)[0] for s in sampling})
print(f"settings classes: {len(classes)}\n  " + "\n  ".join(classes))
print(f"sampling-field declarations: {len(sampling)} in {len(places)} places ({', '.join(places)})\n  " + "\n  ".join(sampling))
print(f"env-option coercion calls: {len(coerce)}\n  " + "\n  ".join(coerce))
