"""pyproject.toml declares the TRL range the suite ran: the lowest TRL it allows passes the GRPO, SFT and DPO smoke
tests and the checks of every hook into TRL's internals (`train/trl_internals.py`).

That TRL is installed alone (`pip install --no-deps --target`) into a scratch folder put first on PYTHONPATH, so
the project's torch, transformers and accelerate serve it as they are. (A `venv --system-site-packages` made from
.venv's interpreter would see the base interpreter's packages, not .venv's.) Needs the package index; skips,
saying so, when it is unreachable.

    .venv/bin/python -m pytest -q -m slow tests/test_trl_range.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
SMOKE_FILES = ["tests/test_trl_internals.py", "tests/test_grpo.py", "tests/test_sft.py", "tests/test_dpo.py"]
SMOKE_TESTS = " or ".join([
    "hook_still_matches_the_installed_libraries", "fused_head_settings_are_read",  # every TRL hook
    "two_grpo_steps_change_every_parameter", "two_step_credit_grpo_steps_change_every_parameter",  # GRPO
    "full_sft_changes_every_parameter", "batch_packing_trains_and_changes_every_parameter",  # SFT
    "training_moves_parameters_and_grows_the_chosen_margin",  # DPO
])
UNREACHABLE = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
               "Network is unreachable", "ProxyError", "ConnectTimeout", "ReadTimeout", "Could not fetch URL")


def lowest_allowed_trl(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """The lower bound of pyproject.toml's `trl` requirement, e.g. "1.16" for `trl>=1.16,<1.17`."""
    dependencies = [Requirement(r) for r in tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["dependencies"]]
    [trl] = [r for r in dependencies if r.name == "trl"]
    floors = [s.version for s in trl.specifier if s.operator in (">=", "==", "~=")]
    assert floors, f"{pyproject}: {trl} has no lower bound; declare the lowest TRL the suite ran"
    return floors[0]


def test_the_lowest_trl_is_the_requirements_lower_bound(tmp_path):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\ndependencies = ["torch>=2.4", "trl>=1.2,<2"]\n')
    assert lowest_allowed_trl(pyproject) == "1.2"
    pyproject.write_text('[project]\ndependencies = ["trl<2"]\n')
    with pytest.raises(AssertionError, match="trl<2 has no lower bound"):
        lowest_allowed_trl(pyproject)


def install_alone(version: str, target: Path) -> None:
    """`trl==version` without its dependencies into `target`; skip when the package index cannot be reached."""
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                          f"trl=={version}"], capture_output=True, text=True, timeout=600)
    if pip.returncode != 0:
        reason = next((m for m in UNREACHABLE if m in pip.stderr), None)
        if reason:
            pytest.skip(f"the package index is unreachable ({reason}): cannot install trl=={version}")
        pytest.fail(f"pip could not install trl=={version}:\n{pip.stderr[-2000:]}")


@pytest.mark.slow  # ~6 min on 2 shared cores: a pip install and seven trainings on the tiny model
def test_the_lowest_allowed_trl_passes_the_grpo_sft_and_dpo_smoke_tests(tmp_path):
    version = lowest_allowed_trl()
    install_alone(version, tmp_path / "trl")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "trl"), os.environ.get("PYTHONPATH", "")])}
    probe = subprocess.run([sys.executable, "-c", "import trl; print(trl.__version__); print(trl.__file__)"],
                           env=env, capture_output=True, text=True, check=True)
    installed, where = probe.stdout.split()
    assert (Requirement(f"trl=={version}").specifier.contains(installed), Path(where).is_relative_to(tmp_path)) == (
        True, True), probe.stdout
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "", "-p", "no:cacheprovider", *SMOKE_FILES,
                          "-k", SMOKE_TESTS], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    assert run.returncode == 0 and "skipped" not in summary, (
        f"pyproject.toml allows trl {installed}, and the smoke tests do not pass with it: raise its lower bound, or "
        f"make them pass ({summary}):\n{run.stdout[-4000:]}")
    print(f"trl {installed}: {summary}")
