"""Each hook into TRL's (or accelerate's) private internals still finds what it relies on (`train.trl_internals`).

A TRL upgrade that moves one fails here, naming the hook, instead of silently changing what is trained."""

from __future__ import annotations

import pytest
from trl.trainer.utils import add_fused_lm_head

from turnforge.models import load_model
from turnforge.train.trl_internals import HOOKS, VERIFIED, fused_head_settings


def failure(hook: str) -> str:
    import accelerate
    import transformers
    import trl

    return (f"TRL hook {hook!r}, verified on {VERIFIED}, no longer matches trl {trl.__version__}, transformers "
            f"{transformers.__version__}, accelerate {accelerate.__version__}: update turnforge/train/trl_internals.py")


@pytest.mark.parametrize("hook", HOOKS, ids=lambda hook: hook.name)
def test_hook_still_matches_the_installed_libraries(hook):
    assert hook.check(), failure(hook.name)


def test_fused_head_settings_are_read_from_trls_patched_forward(tiny_model_dir):
    model, _ = load_model(str(tiny_model_dir), dtype="float32", device="cpu")
    add_fused_lm_head(model, temperature=0.7, outputs=("log_probs",))
    settings = fused_head_settings(model.forward)
    assert settings is not None, failure("fused head closure (trl.trainer.utils.add_fused_lm_head)")
    assert settings["temperature"] == 0.7 and settings["outputs"] == ("log_probs",)


def test_a_changed_hook_fails_with_its_name(monkeypatch):
    """The check can fail: a GRPOTrainer whose scoring step took other parameters is reported by name."""
    from trl import GRPOTrainer

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", lambda self, model, batch: None)
    hook = next(h for h in HOOKS if h.name == "GRPOTrainer._get_per_token_logps_and_entropies")
    assert not hook.check()
    assert "GRPOTrainer._get_per_token_logps_and_entropies" in failure(hook.name)
    # and so can a check that reads TRL's source: a snippet TRL's method does not hold is reported missing
    from turnforge.train.trl_internals import _source_has

    assert not _source_has(GRPOTrainer.train, "return logps, entropies, aux_loss")
