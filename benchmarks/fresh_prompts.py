"""The hf policy in a rollout where new episodes join old ones: fresh prompts batched apart, vs one batch.

When an episode ends, the rollout starts the next task, and the next `generate` call holds that episode's whole
first prompt (~260 tokens) beside episodes that only feed their last reply and observation (~30 tokens) on top
of their cached keys/values. In one batch every row is padded to the fresh prompt's length; turnforge's
`HFPolicy.generate` runs the fresh prompts as their own batch. The peer is the same policy with the prompts of
a call sorted and chunked together (what `generate` did before). Greedy, the quickstart's env and SFT model;
prints seconds, the ratio, and whether the episodes are identical.

    .venv/bin/python benchmarks/fresh_prompts.py --model runs/quickstart/stages/02-sft/model --tasks 200
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial

from turnforge.envs.base import load_tasks, make_env
from turnforge.policies import hf
from turnforge.policies.base import Generation, SamplingParams, prompt_ids
from turnforge.recipes import load_recipe
from turnforge.rollout import RolloutLimits, run_episodes

QUICKSTART_ENV = load_recipe("quickstart").env_options()


class OneBatchPolicy(hf.HFPolicy):
    """The peer: every prompt of a call sorted by length and chunked together, fresh or cached."""

    def generate(self, prompts, params):
        ids = [prompt_ids(p, self.renderer) for p in prompts]
        keys = [(p.task.id, p.sample) for p in prompts]
        seeds = [hf.row_seed(params.seed, p, row) for p, row in zip(prompts, ids, strict=True)]
        cached = [self.prefix_cache.cached_length(key, row) for key, row in zip(keys, ids, strict=True)]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
        out: list[Generation | None] = [None] * len(ids)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            batch = self._generate_batch([ids[i] for i in chunk], params, [keys[i] for i in chunk],
                                         [seeds[i] for i in chunk], [cached[i] for i in chunk])
            for i, gen in zip(chunk, batch, strict=True):
                out[i] = gen
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a model folder, e.g. the quickstart's SFT model")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--open", type=int, nargs="+", default=[64, 200], help="episodes alive at once")
    args = parser.parse_args()
    tasks = load_tasks("household", "test", limit=args.tasks, **QUICKSTART_ENV)
    params = SamplingParams(temperature=0.0, max_new_tokens=48)
    rows = []
    for open_ in args.open:
        runs = {}
        for name, cls in (("apart", hf.HFPolicy), ("one batch", OneBatchPolicy)):
            policy = cls(args.model, device="cpu", dtype="float32", batch_size=open_)
            start = time.perf_counter()
            trajs = run_episodes(policy, partial(make_env, "household", **QUICKSTART_ENV), tasks, 1,
                                 RolloutLimits(max_open=open_), params, renderer=policy.renderer)
            runs[name] = (time.perf_counter() - start, trajs)
        identical = all([t.generated_ids for t in a.turns] == [t.generated_ids for t in b.turns]
                        for a, b in zip(runs["apart"][1], runs["one batch"][1], strict=True))
        rows.append({"open": open_, "apart_s": round(runs["apart"][0], 2), "one_batch_s": round(runs["one batch"][0], 2),
                     "ratio": round(runs["one batch"][0] / runs["apart"][0], 2), "identical_episodes": identical,
                     "success": sum(t.score.success for t in runs["apart"][1]) / len(tasks)})
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
