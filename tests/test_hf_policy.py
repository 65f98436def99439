"""The hf policy on the tiny (untrained) model: batched sampling, exact ids and log-probs, stops, rollouts."""

from __future__ import annotations

import contextlib
import dataclasses
from functools import partial
from unittest import mock

import pytest
import torch

from turnforge.data.sft import trajectory_examples
from turnforge.envs.base import load_tasks, make_env
from turnforge.formats.chat_template import window_messages
from turnforge.policies import make_policy
from turnforge.policies.base import Prompt, SamplingParams, explores
from turnforge.policies.hf import HFPolicy, cut_generation
from turnforge.policies.prefix_cache import PrefixCache
from turnforge.rollout import RolloutLimits, run_episodes


@pytest.fixture(scope="module")
def policy(tiny_model_dir) -> HFPolicy:
    return HFPolicy(str(tiny_model_dir), device="cpu", batch_size=4)


@pytest.fixture(scope="module")
def tasks():
    return load_tasks("household", "test", limit=3)


def prompts_of(policy: HFPolicy, tasks, fmt="act_line") -> list[Prompt]:
    """First prompts of `tasks` (different lengths: left padding matters)."""
    out = []
    for task in tasks:
        env = make_env("household", format=fmt)
        messages = env.reset(task)
        ids = policy.renderer.prompt_ids(messages, env.tools())
        out.append(Prompt(messages=messages, task=task, sample=0, turn=0, ids=ids, tools=env.tools(), env=env))
    return out


def model_logprobs(policy: HFPolicy, prompt: list[int], generated: list[int], temperature: float) -> list[float]:
    """log_softmax(logits / T) of each generated token, from one unpadded forward pass."""
    ids = torch.tensor([prompt + generated])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / (temperature or 1.0), dim=-1)
    return logp.gather(1, torch.tensor(generated)[:, None]).squeeze(1).tolist()


@pytest.mark.parametrize("fmt", ["act_line", "tool_call"])
def test_rollout_ids_are_prompt_generated_and_deltas_and_the_mask_marks_the_generated(policy, tasks, fmt):
    params = SamplingParams(temperature=1.0, max_new_tokens=12, seed=0)
    trajs = run_episodes(policy, lambda: make_env("household", format=fmt), tasks, 2, RolloutLimits(max_turns=3), params,
                         renderer=policy.renderer)
    assert len(trajs) == 6 and all(t.model == "hf" for t in trajs)
    eos = policy.tokenizer.eos_token_id
    for traj in trajs:
        assert traj.prompt_ids == policy.renderer.prompt_ids(traj.messages[:2], traj.tools)
        ids, generated_at = list(traj.prompt_ids), []
        for k, turn in enumerate(traj.turns):
            assert 0 < len(turn.generated_ids) <= 12 and len(turn.logprobs) == len(turn.generated_ids)
            assert all(lp <= 0 for lp in turn.logprobs)
            assert turn.finish_reason in ("stop", "length")
            # the text is exactly the decoded ids (without the end-of-turn token)
            body = turn.generated_ids[:-1] if turn.finish_reason == "stop" else turn.generated_ids
            assert turn.text == policy.tokenizer.decode(body) == traj.messages[2 + 2 * k].content
            # a reply cut by length gets its <|im_end|> from the observation delta
            assert (turn.observation_ids[0] == eos) == (turn.generated_ids[-1] != eos)
            generated_at += range(len(ids), len(ids) + len(turn.generated_ids))
            ids += turn.generated_ids + turn.observation_ids
        [example] = trajectory_examples(traj, policy.tokenizer)
        assert example.input_ids == ids[: len(example.input_ids)]
        assert [i for i, m in enumerate(example.completion_mask) if m] == generated_at


def test_windowed_rollout_records_each_prompt(tiny_model_dir, tasks):
    windowed = HFPolicy(str(tiny_model_dir), device="cpu", window=1)
    params = SamplingParams(max_new_tokens=6, seed=1)
    trajs = run_episodes(windowed, lambda: make_env("household"), tasks[:2], 1, RolloutLimits(max_turns=3), params,
                         renderer=windowed.renderer)
    for traj in trajs:
        assistant_at = [i for i, m in enumerate(traj.messages) if m.role == "assistant"]
        for turn, i in zip(traj.turns, assistant_at, strict=True):
            assert turn.prompt_ids == windowed.renderer.prompt_ids(window_messages(traj.messages[:i], 1), None)
        examples = trajectory_examples(traj, windowed.tokenizer)
        assert [e.input_ids for e in examples] == [t.prompt_ids + t.generated_ids for t in traj.turns]


@pytest.mark.parametrize("temperature, top_k", [(0.0, 0), (0.7, 5)])
def test_logprobs_are_the_models_and_left_padding_changes_nothing(policy, tasks, temperature, top_k):
    prompts = prompts_of(policy, tasks)
    assert len({len(p.ids) for p in prompts}) > 1
    params = SamplingParams(temperature=temperature, top_k=top_k, max_new_tokens=8, seed=3)
    for prompt, gen in zip(prompts, policy.generate(prompts, params), strict=True):
        expected = model_logprobs(policy, prompt.ids, gen.ids, temperature)
        assert gen.logprobs == pytest.approx(expected, abs=1e-4)
        with torch.no_grad():
            logits = policy.model(input_ids=torch.tensor([prompt.ids + gen.ids])).logits[0, len(prompt.ids) - 1 : -1]
        ranks = (logits > logits.gather(1, torch.tensor(gen.ids)[:, None])).sum(dim=1)
        assert ranks.max() < (top_k or 1)  # greedy: the argmax; top-k: within the k best
    if temperature == 0:  # greedy: the same ids alone as in a left-padded batch
        alone = [policy.generate([p], params)[0].ids for p in prompts]
        assert alone == [g.ids for g in policy.generate(prompts, params)]


def test_stop_strings_cut_the_reply_after_the_first_match(policy, tasks):
    params = SamplingParams(max_new_tokens=24, stop=["e"], seed=0)
    gens = policy.generate(prompts_of(policy, tasks) * 3, params)
    stopped = [g for g in gens if g.finish_reason == "stop" and g.ids[-1] not in policy.stop_ids]
    assert stopped  # an untrained model writes an "e" within 24 tokens nearly always
    for g in stopped:
        assert "e" in g.text and "e" not in policy.tokenizer.decode(g.ids[:-1]) and len(g.logprobs) == len(g.ids)
    assert all("e" not in g.text for g in gens if g.finish_reason == "length")


def test_cut_generation():
    decode = lambda ids: "".join("abcdefgh"[i] for i in ids)  # noqa: E731
    assert cut_generation([1, 2, 7, 7], stop_ids=[7], stop=[], decode=decode) == ([1, 2, 7], "stop")
    assert cut_generation([0, 3, 4, 5, 3, 4], stop_ids=[7], stop=["de"], decode=decode) == ([0, 3, 4], "stop")
    assert cut_generation([0, 1, 2], stop_ids=[7], stop=["x"], decode=decode) == ([0, 1, 2], "length")
    assert cut_generation([0, 7, 3, 4], stop_ids=[7], stop=["de"], decode=decode) == ([0, 7], "stop")


def test_sampling_is_seeded_per_reply_whatever_shares_its_batch(tiny_model_dir, policy, tasks):
    """A reply's draws follow from (seed, episode, turn, prompt): the same in another policy, alone or in a batch
    in another order, after other calls; another sample index, turn or seed draws anew."""
    params = SamplingParams(max_new_tokens=8, seed=5, top_k=50)
    prompts = prompts_of(policy, tasks)
    first = [g.ids for g in HFPolicy(str(tiny_model_dir), device="cpu").generate(prompts, params)]
    again = HFPolicy(str(tiny_model_dir), device="cpu", batch_size=2)
    again.generate(prompts[:1], SamplingParams(max_new_tokens=3, seed=9))  # an unrelated call first
    assert [g.ids for g in again.generate(prompts[::-1], params)][::-1] == first
    assert [again.generate([p], params)[0].ids for p in prompts] == first
    assert [g.ids for g in again.generate(prompts, params)] == first  # a repeated call: the same draws
    resampled = [dataclasses.replace(p, sample=1) for p in prompts]
    assert [g.ids for g in again.generate(resampled, params)] != first
    assert [g.ids for g in again.generate(prompts, params.replace(seed=6))] != first


def test_explores_draws_its_share_of_replies_from_the_episode_and_turn(tasks):
    """The per-reply choice between a sampled and a greedy reply depends on (seed, task, sample, turn) alone."""
    prompts = [Prompt(messages=[], task=t, sample=s, turn=k) for t in tasks for s in range(40) for k in range(30)]
    for share in (0.0, 0.25, 1.0):
        params = SamplingParams(temperature=1.0, explore=share)
        drawn = [explores(params, p) for p in prompts]
        assert abs(sum(drawn) / len(drawn) - share) < 0.03  # 3,600 draws: a standard error of 0.7 points
        assert drawn == [explores(params, p) for p in prompts]
    params = SamplingParams(temperature=1.0, explore=0.25)
    assert [explores(params, p) for p in prompts] != [explores(params.replace(seed=1), p) for p in prompts]
    assert not explores(SamplingParams(temperature=0.0), prompts[0])  # greedy decoding never samples


def test_replies_not_explored_are_the_greedy_ones_with_their_logprobs(policy, tasks):
    """explore < 1: a reply `explores` leaves out is the greedy reply, token for token, with the same log-probs
    (log_softmax(logits / T) at T = 1); the explored ones are sampled as with explore = 1."""
    prompts = [dataclasses.replace(p, sample=s) for p in prompts_of(policy, tasks) for s in range(6)]
    greedy = policy.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=8))
    params = SamplingParams(temperature=1.0, max_new_tokens=8, seed=3, explore=0.5)
    mixed = policy.generate(prompts, params)
    sampled = policy.generate(prompts, params.replace(explore=1.0))
    chosen = [explores(params, p) for p in prompts]
    assert 0 < sum(chosen) < len(chosen)
    for gen, g, s, explored in zip(mixed, greedy, sampled, chosen, strict=True):
        want = s if explored else g
        assert gen.ids == want.ids
        assert gen.logprobs == pytest.approx(want.logprobs, abs=1e-5)
    assert any(s.ids != g.ids for s, g in zip(sampled, greedy, strict=True))  # the untrained model samples other replies
    with pytest.raises(ValueError, match="explore"):
        policy.generate(prompts[:1], params.replace(explore=1.5))


def test_make_policy_hf_and_bad_params(tiny_model_dir, policy, tasks):
    made = make_policy("hf", model=str(tiny_model_dir))
    assert isinstance(made, HFPolicy) and made.renderer.window is None and made.model_id == str(tiny_model_dir)
    for bad, message in [({"temperature": -1}, "temperature"), ({"top_p": 0}, "top_p"),
                         ({"top_k": -1}, "top_k"), ({"max_new_tokens": 0}, "max_new_tokens")]:
        with pytest.raises(ValueError, match=message):
            policy.generate(prompts_of(policy, tasks[:1]), SamplingParams(**bad))
    # a prompt without ids (a caller that is not the rollout) is rendered by the policy's renderer
    [prompt] = prompts_of(policy, tasks[:1])
    greedy = SamplingParams(temperature=0, max_new_tokens=4)
    assert policy.generate([prompt], greedy)[0].ids == policy.generate([Prompt(**{**vars(prompt), "ids": None})], greedy)[0].ids


def _counted_store(cache: PrefixCache, held: list[int], key, entry) -> None:
    PrefixCache.store(cache, key, entry)
    held.append(len(cache.entries))


def test_prefix_cache_gives_the_same_episodes_and_forgets_closed_ones(tiny_model_dir):
    """Reusing each episode's keys/values between turns changes nothing but the time: same ids, same log-probs
    (within float noise), across chunked batches; the entries of finished episodes are dropped."""
    tasks = load_tasks("household", "train", limit=6)
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    runs = {}
    for cached in (True, False):
        policy = HFPolicy(str(tiny_model_dir), device="cpu", batch_size=4, prefix_cache=cached)
        limits = RolloutLimits(max_turns=4, max_format_errors=None, max_open=5)
        held = []  # entries held after each store: at most one per open episode
        if cached:
            policy.prefix_cache.store = partial(_counted_store, policy.prefix_cache, held)
        runs[cached] = run_episodes(policy, lambda: make_env("household", max_steps=4), tasks, 1, limits, params,
                                      renderer=policy.renderer)
        if cached:  # used while episodes ran; each dropped when its episode ended (the rollout releases it)
            assert held and max(held) <= limits.max_open
            assert policy.prefix_cache.entries == {}
            policy.generate(prompts_of(policy, load_tasks("household", "test", limit=1)), params)
            assert list(policy.prefix_cache.entries) == [("test-00000", 0)]
            policy.release([("test-00000", 0)])
            assert policy.prefix_cache.entries == {}
    for with_cache, without in zip(runs[True], runs[False], strict=True):
        assert len(with_cache.turns) == len(without.turns) == 4
        for a, b in zip(with_cache.turns, without.turns, strict=True):
            assert a.generated_ids == b.generated_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_prefix_cache_is_used_only_for_a_proper_prefix():
    from turnforge.policies.prefix_cache import Entry, PrefixCache, batch_layout

    cache = PrefixCache()
    cache.store("ep", Entry([5, 6, 7], [(torch.zeros(1, 3, 2), torch.zeros(1, 3, 2))]))
    assert cache.cached_length("ep", [5, 6, 7, 8]) == 3
    assert cache.cached_length("ep", [5, 6, 7]) == 0  # nothing new to feed
    assert cache.cached_length("ep", [5, 9, 7, 8]) == 0  # re-rendered (a history window)
    ids, mask, width_cached, width_suffix = batch_layout([[5, 6, 7, 8], [1, 2]], [3, 0], pad=0)
    assert (width_cached, width_suffix) == (3, 2)
    assert ids.tolist() == [[5, 6, 7, 0, 8], [0, 0, 0, 1, 2]]
    assert mask.tolist() == [[1, 1, 1, 0, 1], [0, 0, 0, 1, 1]]
    small = PrefixCache(max_bytes=10)
    small.store("ep", Entry([1], [(torch.zeros(4), torch.zeros(4))]))  # 32 bytes: over budget, not kept
    assert small.entries == {} and small.held == 0
    budget = PrefixCache(max_bytes=60)  # the bytes held are counted as entries come, are replaced and go
    for key, n in (("a", 2), ("b", 3), ("a", 4), ("c", 2)):  # 16, 24, then a's 16 replaced by 32; c's 16 is over
        budget.store(key, Entry([1], [(torch.zeros(n), torch.zeros(n))]))
    assert set(budget.entries) == {"a", "b"} and budget.held == 56
    budget.forget(["a", "zz"])
    budget.store("c", Entry([1], [(torch.zeros(2), torch.zeros(2))]))
    assert set(budget.entries) == {"b", "c"} and budget.held == 40 == sum(e.nbytes for e in budget.entries.values())


def test_reserved_cache_layer_matches_transformers_dynamic_cache(policy):
    """Keys/values written in place into a reserved buffer give the logits of transformers' own DynamicCache,
    also when a call outgrows the reserve (the buffer doubles), and the cache reports its true length."""
    from transformers import DynamicCache

    from turnforge.policies.prefix_cache import reserved_cache

    torch.manual_seed(0)
    ids = torch.randint(0, policy.model.config.vocab_size - 30, (2, 23))
    outs = {}
    for name, cache in (("dynamic", DynamicCache(config=policy.model.config)),
                        ("reserved", reserved_cache(policy.model.config, reserve=4))):
        logits = []
        with torch.no_grad():
            for start, end in ((0, 9), (9, 10), (10, 11), (11, 23)):  # a prefill, two decode steps, a long chunk
                out = policy.model(input_ids=ids[:, start:end], past_key_values=cache, use_cache=True)
                logits.append(out.logits)
        assert cache.get_seq_length() == 23
        outs[name] = torch.cat(logits, dim=1)
    assert torch.allclose(outs["dynamic"], outs["reserved"], atol=1e-5)
    layer = reserved_cache(policy.model.config, reserve=4).layers[0]
    with pytest.raises(NotImplementedError, match="only grows"):
        layer.crop(-1)


def test_row_sampler_draws_from_the_softmax_of_the_scores():
    """Gumbel-max per row: argmax(scores + noise) over 4,000 rows follows softmax(scores) = (0.7, 0.2, 0.1, 0);
    a -inf score (cut by top-k / top-p) is never drawn."""
    from turnforge.policies.hf import RowSampler

    scores = torch.log(torch.tensor([[0.7, 0.2, 0.1, 0.0]])).repeat(4000, 1)
    drawn = RowSampler(list(range(4000)))(None, scores).argmax(dim=1)
    share = torch.bincount(drawn, minlength=4).float() / 4000
    assert share.tolist() == pytest.approx([0.7, 0.2, 0.1, 0.0], abs=0.025)


def test_fresh_prompts_run_apart_from_episodes_that_go_on_from_their_cache(tiny_model_dir):
    """Episodes end at different turns (a token cap), so new ones join old ones mid-rollout: a `generate` call then
    holds prompts encoded afresh and prompts extending a cached prefix, and runs them as separate batches (one
    batch would pad every row to a fresh prompt's length). The episodes equal those of one prompt per batch."""
    tasks = load_tasks("household", "train", limit=8)
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    limits = RolloutLimits(max_turns=6, max_format_errors=None, max_open=4, max_total_tokens=330)
    runs, mixed_calls, batches = {}, [], []
    for batch_size in (64, 1):
        policy = HFPolicy(str(tiny_model_dir), device="cpu", batch_size=batch_size)
        generate_batch = policy._generate_batch

        def spy(prompts, params, keys, seeds, cached, sampled, policy=policy, generate_batch=generate_batch):
            batches.append({policy.prefix_cache.cached_length(k, p) > 0 for k, p in zip(keys, prompts, strict=True)})
            return generate_batch(prompts, params, keys, seeds, cached, sampled)

        def generate(prompts, params, policy=policy, generate=policy.generate):
            fresh = {policy.prefix_cache.cached_length((p.task.id, p.sample), p.ids) == 0 for p in prompts}
            mixed_calls.append(len(fresh) == 2)
            return generate(prompts, params)

        policy._generate_batch, policy.generate = spy, generate
        runs[batch_size] = run_episodes(policy, lambda: make_env("household"), tasks, 1, limits, params,
                                        renderer=policy.renderer)
    assert any(mixed_calls), "some call must hold both fresh and cached prompts"
    assert all(len(kinds) == 1 for kinds in batches)  # no batch mixes them
    assert len({len(t.turns) for t in runs[64]}) > 1
    for grouped, alone in zip(runs[64], runs[1], strict=True):
        assert [t.generated_ids for t in grouped.turns] == [t.generated_ids for t in alone.turns]


def test_grouped_heads_in_sdpa_give_transformers_attention_and_the_same_episodes(tiny_model_dir):
    """`cpu_gqa`: several new tokens over a cached, left-padded prefix (a turn's prompt) give the logits of
    transformers' SDPA attention (which copies each key/value head per query head), decoding steps are
    transformers' own, the same greedy episodes come out, and the model's attention setting is restored."""
    from turnforge.models.attention import NAME, cpu_gqa
    from turnforge.policies.prefix_cache import reserved_cache

    policy = HFPolicy(str(tiny_model_dir), device="cpu", batch_size=4)
    model = policy.model
    assert model.config.num_attention_heads > model.config.num_key_value_heads  # grouped heads: the case at stake
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size - 30, (3, 40))
    mask = torch.ones_like(ids)
    mask[0, :7], mask[1, :3], mask[2, 20:24] = 0, 0, 0  # left padding, and a pad run between cached part and suffix
    outs = {}
    for way in ("transformers", "grouped"):
        cache = reserved_cache(model.config, reserve=8)
        context = cpu_gqa(model) if way == "grouped" else contextlib.nullcontext()
        with torch.no_grad(), context:
            assert model.config._attn_implementation == (NAME if way == "grouped" else "sdpa")
            first = model(input_ids=ids[:, :24], attention_mask=mask[:, :24], past_key_values=cache, use_cache=True)
            second = model(input_ids=ids[:, 24:], attention_mask=mask, past_key_values=cache, use_cache=True)
        outs[way] = torch.cat([first.logits, second.logits], dim=1)
        assert model.config._attn_implementation == "sdpa"
    real = mask.bool()
    assert torch.allclose(outs["grouped"][real], outs["transformers"][real], atol=1e-5)

    tasks = load_tasks("household", "test", limit=5)
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    episodes = {}
    for way in ("transformers", "grouped"):
        with mock.patch("turnforge.policies.hf.cpu_gqa", lambda m: contextlib.nullcontext()) if way == "transformers" \
                else contextlib.nullcontext():
            trajs = run_episodes(policy, lambda: make_env("household", max_steps=4), tasks, 1,
                                 RolloutLimits(max_turns=4, max_format_errors=None, max_open=5), params,
                                 renderer=policy.renderer)
        episodes[way] = [[t.generated_ids for t in traj.turns] for traj in trajs]
    assert episodes["grouped"] == episodes["transformers"]


@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.99])
def test_top_p_keeps_the_tokens_transformers_warper_keeps(top_p):
    """`TopP` looks for the nucleus among each row's 64 most likely tokens: peaked rows (found there), flat rows
    (nucleus past 64 tokens: transformers' warper), rows with tokens already filtered (-inf, e.g. by top-k) and a
    row with all the mass on one token give transformers' scores exactly."""
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    from turnforge.policies.hf import TopP

    torch.manual_seed(0)
    vocab = 1678
    rows = [torch.randn(40, vocab) * 4, torch.randn(8, vocab) * 0.1,
            TopKLogitsWarper(20)(None, torch.randn(8, vocab) * 2), torch.full((1, vocab), -5.0)]
    rows[-1][0, 7] = 30.0
    scores = torch.cat(rows)
    ids = torch.zeros(len(scores), 1, dtype=torch.long)
    ours, theirs = TopP(top_p)(ids, scores), TopPLogitsWarper(top_p)(ids, scores)
    assert torch.equal(ours, theirs)
    kept = (ours > -float("inf")).sum(dim=-1)
    assert kept[-1] == 1 and (kept[40:48] > 64).all()  # the one-token row; the flat rows took the whole sort


def test_a_prompt_past_the_models_context_ends_its_episode_with_serves_refusal(tiny_model_dir, tasks):
    """Issue 40 (9): the hf policy generated from any prompt, past the model's positions without a word (`serve`
    refused the same prompt). Now it refuses it by serve's rule and words (`context_refusal`): the episode ends
    with stop reason max_tokens, the run goes on, and the refusal is a warning."""
    from turnforge.models.loading import load_model
    from turnforge.types import StopReason

    lm, tokenizer = load_model(str(tiny_model_dir), device="cpu")
    env = make_env("household", format="act_line")
    first = len(HFPolicy.from_model(lm, tokenizer).renderer.prompt_ids(env.reset(tasks[0]), None))
    lm.config.max_position_embeddings = first + 40  # the first turn fits, a later one does not
    policy = HFPolicy.from_model(lm, tokenizer)
    params = SamplingParams(temperature=1.0, max_new_tokens=16, seed=0)
    with pytest.warns(RuntimeWarning, match=rf"This model's maximum context length is {first + 40} tokens; the messages "
                      r"take \d+ and max_tokens is 16: the episode ends \(stop reason max_tokens\)"):
        [traj] = run_episodes(policy, lambda: make_env("household", format="act_line"), tasks[:1], 1,
                              RolloutLimits(max_turns=10), params, renderer=policy.renderer)
    assert traj.stop_reason == StopReason.max_tokens and 1 <= len(traj.turns) < 10
    position = len(traj.prompt_ids)  # no reply was generated past the model's positions
    for turn in traj.turns:
        assert position + len(turn.generated_ids) <= first + 40
        position += len(turn.generated_ids) + len(turn.observation_ids)
