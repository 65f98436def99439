"""The hf policy on the tiny (untrained) model: batched sampling, exact ids and log-probs, stops, rollouts."""

from __future__ import annotations

import dataclasses
import time

import pytest
import torch

from turnforge.data.sft import trajectory_examples
from turnforge.envs.base import load_tasks, make_env
from turnforge.formats.chat_template import window_messages
from turnforge.policies import make_policy
from turnforge.policies.base import Prompt, SamplingParams, explores
from turnforge.policies.hf import HFPolicy, cut_generation
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


def test_prefix_sharing_gives_the_same_episodes_and_skips_the_shared_prefill(tiny_model_dir):
    """An episode's turn k reuses the KV blocks its earlier turns filled (the engine's block sharing): the same ids
    and log-probs as without sharing, and fewer tokens run. Without sharing the model runs every prompt token and
    every generated token but each reply's last (it is the next step's input only while the reply goes on)."""
    tasks = load_tasks("household", "train", limit=6)
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    runs, ran = {}, {}
    for sharing in (True, False):
        policy = HFPolicy(str(tiny_model_dir), device="cpu", batch_size=4, prefix_sharing=sharing)
        limits = RolloutLimits(max_turns=4, max_format_errors=None, max_open=5)
        runs[sharing] = run_episodes(policy, lambda: make_env("household", max_steps=4), tasks, 1, limits, params,
                                     renderer=policy.renderer)
        engine = policy.engine
        replies = sum(len(t.turns) for t in runs[sharing])
        ran[sharing] = (engine.forward_tokens, engine.submitted + engine.generated - replies)
        policy.close()
    assert ran[False][0] == ran[False][1]  # no sharing: every token the formula counts, once
    saved = ran[True][1] - ran[True][0]
    later_prompts = sum(len(t.prompt_ids) for traj in runs[True] for t in traj.turns[1:])
    assert saved > 0.5 * later_prompts  # most of each later turn's prompt came from shared blocks
    for shared, alone in zip(runs[True], runs[False], strict=True):
        assert len(shared.turns) == len(alone.turns) == 4
        for a, b in zip(shared.turns, alone.turns, strict=True):
            assert a.generated_ids == b.generated_ids
            assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_a_short_reply_is_handed_back_while_a_long_one_goes_on(policy, tasks):
    """Each reply is its own engine request: one of 2 tokens comes back while one of 60 is still generating."""
    from turnforge.policies.engine import Reply

    [first, second] = prompts_of(policy, tasks[:2])
    greedy = lambda: Reply(0.0, 0, 1.0, seed=0, sampled=False)  # noqa: E731
    engine = policy.engine
    long = engine.submit(first.ids, 60, greedy())
    short = engine.submit(second.ids, 2, greedy())
    assert len(short.result(timeout=60).ids) <= 2
    assert not long.done()
    assert len(long.result(timeout=120).ids) > 2


def test_greedy_replies_are_transformers_generate_s(policy, tasks):
    """Greedy ids equal plain `model.generate` on each prompt alone (no engine, no padding), up to the first stop."""
    prompts = prompts_of(policy, tasks)
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    for prompt, gen in zip(prompts, policy.generate(prompts, params), strict=True):
        with torch.no_grad():
            out = policy.model.generate(torch.tensor([prompt.ids]), max_new_tokens=12, do_sample=False,
                                        eos_token_id=policy.stop_ids, pad_token_id=policy.tokenizer.pad_token_id)
        assert gen.ids == out[0, len(prompt.ids):].tolist()[: len(gen.ids)]


def _draw(sampling, replies, scores):
    """One engine step of `TurnSampling` on `scores` [rows, vocab] for `replies`: (drawn ids, recorded log-probs),
    through the argument rows and the output rows the engine hands it."""
    from types import SimpleNamespace

    from turnforge.policies.engine import ARG_ROWS

    sampling.replies = {f"r{i}": reply for i, reply in enumerate(replies)}
    requests = [SimpleNamespace(state=SimpleNamespace(request_id=f"r{i}"), has_new_token=True) for i in range(len(replies))]
    storage = torch.zeros(ARG_ROWS, len(replies), dtype=torch.int32)
    sampling.prepare_tensor_args(requests, storage)
    out = sampling(None, scores, storage)
    output_ids = torch.zeros(2, len(replies), dtype=torch.int32)
    sampling.write_outputs(out.unsqueeze(0), output_ids)
    return output_ids[0].long(), output_ids[1].view(torch.float32)


PROBS = torch.tensor([0.7, 0.2, 0.1, 0.0])


@pytest.mark.parametrize("temperature, top_k, top_p, share", [
    (1.0, 0, 1.0, [0.7, 0.2, 0.1, 0.0]),
    (0.5, 0, 1.0, [0.49 / 0.54, 0.04 / 0.54, 0.01 / 0.54, 0.0]),  # softmax(log p / 0.5) = p^2 / sum p^2
    (1.0, 2, 1.0, [0.7 / 0.9, 0.2 / 0.9, 0.0, 0.0]),  # top-k 2 keeps 0.7 and 0.2
    (1.0, 0, 0.75, [0.7 / 0.9, 0.2 / 0.9, 0.0, 0.0]),  # ascending cumsum 0.1, 0.3, 1.0: 0.1 <= 1 - 0.75 is cut
])
def test_turn_sampling_draws_from_the_truncated_softmax_and_records_the_untruncated_logprob(temperature, top_k, top_p,
                                                                                           share):
    """One draw per reply over 4,000 replies of different seeds: the drawn ids follow softmax(scores / T) after
    top-k / top-p (hand-worked shares); a zero-probability score is never drawn; the recorded log-probability is
    the chosen token's log_softmax(scores / T) before truncation (the contract TRL recomputes)."""
    from turnforge.policies.engine import Reply, TurnSampling

    scores = torch.log(PROBS).repeat(4000, 1)
    replies = [Reply(temperature, top_k, top_p, seed=i, sampled=True) for i in range(4000)]
    drawn, recorded = _draw(TurnSampling(graphs=False), replies, scores)
    assert (torch.bincount(drawn, minlength=4).float() / 4000).tolist() == pytest.approx(share, abs=0.025)
    assert recorded.tolist() == pytest.approx(torch.log_softmax(scores[0] / temperature, 0)[drawn].tolist(), abs=1e-6)


def test_turn_sampling_draws_depend_on_the_seed_and_token_index_only():
    """The same (seed, token index) draws the same token whatever else shares the step, in eager mode or with the
    graph path's always-on sort and draw; a greedy row is the argmax and its log_softmax, whatever its
    neighbours; the next token of a reply draws a fresh number."""
    from turnforge.policies.engine import Reply, TurnSampling

    torch.manual_seed(0)
    scores = torch.randn(6, 50)
    def batch():
        return [Reply(0.8, 10, 0.9, seed=s, sampled=True) for s in (11, 12, 13)] + [Reply(0.0, 0, 1.0, 0, False)]
    alone, _ = _draw(TurnSampling(graphs=False), batch()[:1], scores[:1])
    for graphs in (False, True):
        together, recorded = _draw(TurnSampling(graphs=graphs), batch(), scores[:4])
        assert together[0] == alone[0]
        assert together[3] == scores[3].argmax()
        assert recorded[3] == pytest.approx(torch.log_softmax(scores[3], 0).max().item(), abs=1e-6)
    sampling, replies = TurnSampling(graphs=False), [Reply(1.0, 0, 1.0, seed=5, sampled=True)]
    flat = torch.zeros(1, 1000)  # uniform over 1,000 tokens
    first, _ = _draw(sampling, replies, flat)
    second, _ = _draw(sampling, replies, flat)  # the same reply, its next token
    assert replies[0].drawn == 2 and first != second


def test_turn_sampling_is_one_graph_with_no_host_sync():
    """What lets the engine capture a step in a CUDA graph: the sampler traces as one graph (no `.item()`,
    `.tolist()` or data-dependent Python inside), checked by torch.compile's tracer (fullgraph, eager backend)."""
    from turnforge.policies.engine import Reply, TurnSampling, _arg_rows

    sampling = TurnSampling(graphs=True)
    args = _arg_rows([Reply(0.7, 5, 0.9, seed=3, sampled=True), Reply(0.0, 0, 1.0, 0, False)])
    scores = torch.randn(2, 64)
    sampling(None, scores, args)
    eager = sampling._drawn
    torch.compile(lambda s, a: sampling(None, s, a), backend="eager", fullgraph=True)(scores, args)
    assert all(torch.equal(a, b) for a, b in zip(eager, sampling._drawn, strict=True))


def test_the_engine_internals_turnforge_touches_are_there_or_it_says_so():
    """`_install` is the one place that reaches into transformers' manager: the installed release is one it was
    verified with, and a manager without the list it replaces, or a cache without the read-back it replaces, is
    refused by name."""
    import transformers

    from turnforge.policies.engine import VERIFIED_TRANSFORMERS, ReusedReads, _install

    assert ".".join(transformers.__version__.split(".")[:2]) in VERIFIED_TRANSFORMERS
    with pytest.raises(RuntimeError, match="no longer has a `logit_processor` list.*verified with transformers"):
        _install(object(), None, reuse_reads=True)
    from types import SimpleNamespace

    from transformers.generation.continuous_batching.cb_logits_processors import (
        ContinuousBatchingLogitsProcessorList,
    )
    from transformers.generation.logits_process import LogitsProcessorList

    from turnforge.policies.engine import TurnSampling

    manager = SimpleNamespace(logit_processor=ContinuousBatchingLogitsProcessorList(LogitsProcessorList()),
                              _create_batch_processor=lambda: SimpleNamespace(model_runner=object()))
    _install(manager, TurnSampling(graphs=False), reuse_reads=True)
    with pytest.raises(RuntimeError, match="model runner no longer has `_sample`.*verified with transformers"):
        manager._create_batch_processor()
    with pytest.raises(RuntimeError, match="no longer has `cache_allocators`.*verified with transformers"):
        ReusedReads().install(SimpleNamespace())


def test_the_reused_read_back_is_transformers_update_into_kept_buffers():
    """`ReusedReads.update` writes and reads the cache as transformers' `FullAttentionCacheAllocator.update` does
    (same cache after, same keys and values out), into the same two buffers from one call to the next; a longer
    read grows them; a step with nothing to read returns the new states."""
    from types import SimpleNamespace

    from transformers.generation.continuous_batching.cache_allocators.full_attention import (
        FullAttentionCacheAllocator,
    )

    from turnforge.policies.engine import ReusedReads

    torch.manual_seed(0)

    def allocator():
        return SimpleNamespace(_kv_token_views={0: (torch.zeros(64, 2, 8), torch.zeros(64, 2, 8))})

    theirs, ours, reads = allocator(), allocator(), ReusedReads()
    pointers = []
    for write, read in ((torch.arange(5), torch.arange(5)), (torch.tensor([9, 10]), torch.tensor([0, 3, 9, 10])),
                        (torch.tensor([20]), torch.cat([torch.arange(5), torch.tensor([9, 10, 20])]))):
        keys, values = torch.randn(len(write), 2, 8), torch.randn(len(write), 2, 8)
        expected = FullAttentionCacheAllocator.update(theirs, keys, values, 0, read, write)
        got = reads.update(ours, keys, values, 0, read, write)
        assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))
        assert all(torch.equal(a, b) for a, b in zip(theirs._kv_token_views[0], ours._kv_token_views[0], strict=True))
        pointers.append(got[0].data_ptr())
    assert pointers[0] == pointers[1] != pointers[2]  # kept; then grown for a read of 8 rows (> 5)
    new = (torch.randn(1, 2, 8), torch.randn(1, 2, 8))
    assert reads.update(ours, *new, 0, torch.tensor([], dtype=torch.long), torch.tensor([30]))[0] is new[0]


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


def test_a_forward_during_an_engine_step_stays_causal(tiny_model_dir, tasks):
    """transformers' forward sets `config.is_causal` for its duration (the engine's: False) and restores it after. A
    forward on the same model from another thread during an engine step ran non-causal and left `False` behind
    for every later forward (`turnforge serve`'s scoring beside its generation; seen as a flaky log-prob test).
    Forced overlap: the engine's step waits inside its first layer until this thread's forward starts (2 s at
    most); forwards are serialized, so this one waits for the step instead, and both it and every later forward
    equal the forward before."""
    import threading

    from turnforge.models.loading import load_model

    lm, tokenizer = load_model(str(tiny_model_dir), device="cpu")
    policy = HFPolicy.from_model(lm, tokenizer)
    [prompt] = prompts_of(policy, tasks[:1])
    ids = torch.tensor([prompt.ids])
    causal_before = getattr(lm.config, "is_causal", None)
    with torch.no_grad():
        reference = lm(input_ids=ids).logits
    me, engine_in_step, mine_started = threading.get_ident(), threading.Event(), threading.Event()

    def first_layer(_module, _args):
        if threading.get_ident() == me:
            mine_started.set()
        elif not engine_in_step.is_set():
            engine_in_step.set()
            mine_started.wait(timeout=2)

    handle = lm.model.layers[0].register_forward_pre_hook(first_layer)
    replies: list = []
    generating = threading.Thread(target=lambda: replies.extend(
        policy.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=4))))
    generating.start()
    try:
        assert engine_in_step.wait(timeout=60)
        with torch.no_grad():
            during = lm(input_ids=ids).logits
        generating.join(timeout=60)
    finally:
        handle.remove()
        policy.close()
    assert len(replies) == 1 and replies[0].ids
    assert getattr(lm.config, "is_causal", None) == causal_before
    assert not hasattr(lm, "_turnforge_engines") and lm.config._attn_implementation == "sdpa"  # all undone
    with torch.no_grad():
        after = lm(input_ids=ids).logits
    assert torch.allclose(during, reference, atol=1e-5) and torch.allclose(after, reference, atol=1e-5)


def test_the_engine_is_made_once_when_threads_ask_for_it_at_once(tiny_model_dir):
    """The rollout calls `generate` from several threads at once; the lazily made engine raced, and two engines on
    one model each took requests (each with its own cache; one never closed)."""
    from concurrent.futures import ThreadPoolExecutor

    policy = HFPolicy(str(tiny_model_dir), device="cpu", batch_size=4)
    try:
        with ThreadPoolExecutor(8) as pool:
            engines = list(pool.map(lambda _: policy.engine, range(8)))
        assert all(e is engines[0] for e in engines)
    finally:
        policy.close()


def test_setting_a_policy_up_releases_the_threads_idle_openmp_workers(policy):
    """The thread that sets a policy up (it trained, it loaded a model) then waits while the engine's thread computes:
    its idle OpenMP workers go, or GNU OpenMP has every team sleep between regions (`release_idle_openmp`)."""
    import os
    import threading

    if len(os.sched_getaffinity(0)) < 2 or not os.path.isdir("/proc/self/task"):
        pytest.skip("needs two cores and Linux's /proc")
    threads = lambda: set(os.listdir("/proc/self/task"))  # noqa: E731
    seen: dict[str, set[str]] = {}

    def trained_then_sets_up():
        # two threads in this thread's regions whatever the load: a new thread takes the count last set anywhere in
        # the process, which the free-core count (machine.CpuThreads) makes 1 beside a busy process
        torch.set_num_threads(2)
        before = threads()
        torch.ones(4_000_000).exp().sum()  # a parallel region: this thread gets OpenMP workers, kept after
        seen["workers"] = threads() - before
        HFPolicy.from_model(policy.model, policy.tokenizer, batch_size=2).close()
        deadline = time.monotonic() + 10
        while seen["workers"] & threads() and time.monotonic() < deadline:  # a released worker exits on its own
            time.sleep(0.05)
        seen["left"] = seen["workers"] & threads()

    worker = threading.Thread(target=trained_then_sets_up)
    worker.start()
    worker.join()
    assert seen["workers"], "the parallel region made no OpenMP worker"
    assert not seen["left"]


def test_the_cpu_attention_attends_each_request_to_its_own_keys():
    """`varlen_sdpa` on three packed requests (a decoding one, a prefill chunk after cached keys, a whole prompt),
    grouped key/value heads: each query row equals causal attention (bottom-right aligned) over its request's keys
    alone, computed by hand; without the engine's bounds it is transformers' SDPA."""
    from types import SimpleNamespace

    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from turnforge.policies.engine import varlen_sdpa

    torch.manual_seed(0)
    heads, kv_heads, dim, shapes = 4, 2, 16, [(1, 5), (3, 7), (4, 4)]  # (queries, keys) per request
    qs = [torch.randn(1, heads, q, dim) for q, _ in shapes]
    ks = [torch.randn(1, kv_heads, k, dim) for _, k in shapes]
    vs = [torch.randn(1, kv_heads, k, dim) for _, k in shapes]
    out, _ = varlen_sdpa(SimpleNamespace(), torch.cat(qs, 2), torch.cat(ks, 2), torch.cat(vs, 2), None,
                         scaling=dim ** -0.5, cu_seq_lens_q=torch.tensor([0, 1, 4, 8]),
                         cu_seq_lens_k=torch.tensor([0, 5, 12, 16]))
    expected = []
    for (q, k), query, key, value in zip(shapes, qs, ks, vs, strict=True):
        key, value = key.repeat_interleave(heads // kv_heads, 1), value.repeat_interleave(heads // kv_heads, 1)
        allowed = torch.arange(k)[None, :] <= torch.arange(q)[:, None] + (k - q)
        scores = (query @ key.transpose(-1, -2) * dim ** -0.5).masked_fill(~allowed, float("-inf"))
        expected.append(torch.softmax(scores, -1) @ value)
    assert torch.allclose(out, torch.cat(expected, 2).transpose(1, 2), atol=1e-5)
    module = SimpleNamespace(num_key_value_groups=2, is_causal=True)
    plain = varlen_sdpa(module, qs[2], ks[2], vs[2], None, scaling=dim ** -0.5)[0]
    assert torch.equal(plain, sdpa_attention_forward(module, qs[2], ks[2], vs[2], None, scaling=dim ** -0.5)[0])


def test_after_the_engines_loop_dies_a_request_fails_at_once(tiny_model_dir, tasks):
    """A forward that raises ends transformers' loop: the open request fails with the reason, and a request made
    after it is refused at once (it waited forever: no thread was left to answer it)."""
    from turnforge.models.loading import load_model

    lm, tokenizer = load_model(str(tiny_model_dir), device="cpu")
    policy = HFPolicy.from_model(lm, tokenizer)
    [prompt] = prompts_of(policy, tasks[:1])
    params = SamplingParams(temperature=0.0, max_new_tokens=4)

    def broken(_module, _args):
        raise RuntimeError("a broken forward")

    handle = lm.model.layers[0].register_forward_pre_hook(broken)
    try:
        with pytest.raises(RuntimeError, match="a broken forward|engine stopped"):
            policy.generate([prompt], params)
        for _ in range(50):  # the loop thread ends just after it fails the open requests
            if policy.engine._failed is not None:
                break
            time.sleep(0.1)
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="engine stopped"):
            policy.generate([prompt], params)
        assert time.monotonic() - started < 5
    finally:
        handle.remove()
        policy.close()


def test_the_cpu_engines_footprint_counts_an_attention_mask_only_where_transformers_makes_one(tiny_model_dir, monkeypatch):
    """With the CPU attention transformers allocates no mask (`attn_mask_is_needed`), so its footprint counts none;
    with SDPA it counts the mask it makes. Without the attribute replaced, the engine is refused by name."""
    from transformers import AutoConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig
    from transformers.generation.continuous_batching import cache

    from turnforge.policies import engine

    config = AutoConfig.from_pretrained(tiny_model_dir)

    def mask_bytes(attention: str) -> int:
        config._attn_implementation = attention
        handler = cache.PagedAttentionMemoryHandler(config, ContinuousBatchingConfig(max_memory_percent=0.8), torch.float32, 4096, 32, 1024,
                                                    ["full_attention"])
        return handler.attention_mask_bytes(1024, 100)

    assert mask_bytes(engine.CPU_ATTENTION) == 0
    assert mask_bytes("sdpa") == 1024 * (100 * 32 + 1024) * 4
    monkeypatch.delattr(cache.PagedAttentionMemoryHandler, "attention_mask_bytes")
    with pytest.raises(RuntimeError, match="attention_mask_bytes.*verified with transformers"):
        engine._count_masks_as_allocated()
