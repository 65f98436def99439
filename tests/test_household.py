"""The native household: ALFWorld strings and rules, grammars, hints, progress, splits, the expert."""

from __future__ import annotations

from collections import Counter

import pytest

from turnforge.envs.base import get_env_spec, load_tasks, make_env
from turnforge.envs.household.catalog import CAN_CONTAIN, TASK_TYPES, is_plausible
from turnforge.envs.household.engine import World
from turnforge.envs.household.expert import expert_plan
from turnforge.envs.household.scene import (
    SPLITS,
    Knobs,
    display_names,
    entity_names,
    generate_split,
    generate_task,
    is_held_out,
    pddl_id,
)
from turnforge.formats.base import FormatError
from turnforge.types import Message, StopReason, Task


def _scene(task_type="pick_heat_then_place_in_recep", transform="heat", count=1, toggle=None, receptacle="CounterTop"):
    """The hand-made game of benchmarks.md §2 (a hot apple to a countertop), as a task dict."""
    recs = [("CounterTop", 1, 12, False), ("CounterTop", 2, 11, False), ("Fridge", 1, 13, True),
            ("Microwave", 1, 14, True), ("Cabinet", 1, 15, True), ("SinkBasin", 1, 16, False)]
    return {
        "scene": "kitchen", "task_type": task_type,
        "goal": {"object": "Apple", "receptacle": receptacle, "toggle": toggle, "transform": transform, "count": count},
        "goal_text": "put a hot apple in countertop",
        "receptacles": [{"id": pddl_id(t, k), "type": t, "loc": loc, "openable": o, "opened": False}
                        for t, k, loc, o in recs],
        "objects": [{"id": pddl_id("Apple", 1), "type": "Apple", "in": pddl_id("Fridge", 1)},
                    {"id": pddl_id("Mug", 1), "type": "Mug", "in": pddl_id("CounterTop", 2)}],
    }


def _task(data, split="test"):
    return Task(id="hand-0", env="household", split=split, category=data["task_type"], data=data)


def test_display_names_follow_alfworld_demangler():
    ids = [pddl_id("CounterTop", 1), pddl_id("CounterTop", 2), pddl_id("Cabinet", 1), pddl_id("SinkBasin", 1)]
    names = display_names(ids)
    # Numbers are handed out from the highest down in (lower-cased) id order.
    assert [names[i] for i in ids] == ["countertop 2", "countertop 1", "cabinet 1", "sinkbasin 1"]


def test_transcript_matches_alfworld_reference_game():
    """The transcript of benchmarks.md §2 (recorded from the real engine, grammar 0.4.x)."""
    w = World(_scene(), grammar="0.4")
    assert w.intro() == (
        "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a countertop 2, "
        "a countertop 1, a fridge 1, a microwave 1, and a sinkbasin 1.\n\nYour task is to: put a hot apple in countertop."
    )
    expected = [
        ("go to fridge 1", "You arrive at fridge 1. The fridge 1 is closed."),
        ("open fridge 1", "You open the fridge 1. The fridge 1 is open. In it, you see a apple 1."),
        ("take apple 1 from fridge 1", "You pick up the apple 1 from the fridge 1."),
        ("fly to the moon", "Nothing happens."),
        ("go to microwave 1", "You arrive at microwave 1. The microwave 1 is closed."),
        ("heat apple 1 with microwave 1", "You heat the apple 1 using the microwave 1."),
        ("go to countertop 1", "You arrive at countertop 1. On the countertop 1, you see a mug 1."),
        ("examine apple 1", "This is a hot apple 1."),
        ("inventory", "You are carrying: a apple 1."),
        ("look", "You are facing the countertop 1. Next to it, you see nothing."),
        ("go to countertop 1", "Nothing happens."),
        ("Go to fridge 1", "Nothing happens."),
    ]
    for command, feedback in expected:
        assert w.step(command)[0] == feedback, command
    assert not w.goal_reached()
    assert w.step("move apple 1 to countertop 1")[0] == "You move the apple 1 to the countertop 1."
    assert w.goal_reached()


def test_grammar_03_uses_loc_numbers_and_put_in_on():
    w = World(_scene(), grammar="0.3")
    assert w.step("go to countertop 1")[0] == "You arrive at loc 11. On the countertop 1, you see a mug 1."
    w.step("take mug 1 from countertop 1")
    assert w.step("move mug 1 to countertop 1")[0] == "Nothing happens."
    assert w.step("help")[0] == "Nothing happens."
    assert w.step("put mug 1 in/on countertop 1")[0] == "You put the mug 1 in/on the countertop 1."
    assert "put mug 1 in/on countertop 1" not in w.admissible()


def test_admissible_is_sorted_and_exactly_the_valid_commands():
    w = World(_scene(), grammar="0.4")
    w.step("go to countertop 1")
    assert w.admissible() == [
        "examine countertop 1", "go to cabinet 1", "go to countertop 2", "go to fridge 1", "go to microwave 1",
        "go to sinkbasin 1", "help", "inventory", "look", "take mug 1 from countertop 1",
    ]
    for command in w.admissible():
        assert World(_scene(), grammar="0.4").check(command) is not None


def test_examine_receptacle_object_and_cold_rules():
    w = World(_scene(), grammar="0.4")
    w.step("go to countertop 1")
    w.step("take mug 1 from countertop 1")
    assert w.step("examine mug 1")[0] == "This is a normal mug 1. In it, you see nothing."
    w.step("move mug 1 to countertop 1")
    w.step("go to fridge 1")
    w.step("open fridge 1")
    w.step("take apple 1 from fridge 1")
    w.step("cool apple 1 with fridge 1")
    assert w.step("examine apple 1")[0] == "This is a cold apple 1."


@pytest.mark.parametrize(
    ("commands", "hint"),
    [
        (["go to fridge 1", "take apple 1 from fridge 1"], "The fridge 1 is closed; open it first."),
        (["heat apple 1 with microwave 1"], "You are not holding the apple 1. You are not carrying anything."),
        (["go to fridge 1", "open fridge 1", "take apple 1 from fridge 1", "heat apple 1 with microwave 1"],
         "You are not at the microwave 1. Go to it first."),
        (["go to fridge 1", "open fridge 1", "take apple 1 from fridge 1", "heat apple 1 with fridge 1"],
         "You can only heat things with a microwave."),
        (["go to fridge 1", "go to fridge 1"], "You are already at the fridge 1."),
    ],
)
def test_hints_replace_nothing_happens(commands, hint):
    env = make_env("household", grammar="0.4", hints=True)
    env.reset(_task(_scene()))
    for command in commands:
        result = env.step(Message("assistant", command))
    assert result.messages[0].content == hint
    assert result.info["hint"] == hint
    plain = make_env("household", grammar="0.4")
    plain.reset(_task(_scene()))
    for command in commands:
        result = plain.step(Message("assistant", command))
    assert result.messages[0].content == "Nothing happens." and result.info["hint"] == hint


def test_progress_counts_subgoals_monotonically():
    env = make_env("household", grammar="0.4")
    env.reset(_task(_scene()))
    seen = []
    for command in ["go to fridge 1", "open fridge 1", "take apple 1 from fridge 1", "go to microwave 1",
                    "heat apple 1 with microwave 1", "go to countertop 1", "move apple 1 to countertop 1"]:
        seen.append(env.step(Message("assistant", command)).info["progress"])
    # subgoals: found, taken, transformed, done
    assert seen == [0.0, 0.25, 0.5, 0.5, 0.75, 0.75, 1.0]
    assert env.score().success and env.score().progress == 1.0


def test_format_errors_and_max_steps():
    env = make_env("household", max_steps=3)
    env.reset(_task(_scene()))
    r = env.step(FormatError("no ACTION: line", "hello"))
    assert r.messages[0].content == "Nothing happens." and not r.done
    env.step(Message("assistant", "look"))
    r = env.step(Message("assistant", "look"))
    assert r.done and r.stop is StopReason.max_turns
    assert env.score().details["format_errors"] == 1 and not env.score().success


def test_tool_call_format_uses_the_act_tool():
    env = make_env("household", format="tool_call", grammar="0.4")
    env.reset(_task(_scene()))
    assert env.tools()[0]["function"]["name"] == "act"
    reply = env.action_message("go to fridge 1")
    r = env.step(reply)
    assert r.messages[0].role == "tool" and r.messages[0].content.startswith("You arrive at fridge 1.")


def test_splits_are_reproducible_and_test_combinations_are_unseen_in_train():
    train = load_tasks("household", "train", limit=1200)
    test = load_tasks("household", "test", limit=600)
    assert load_tasks("household", "test", limit=5)[4].data == test[4].data
    assert load_tasks("household", "test", limit=5, seed=1)[4].data != test[4].data

    def combo(t):
        g = t.data["goal"]
        return (t.category, g["object"], g["receptacle"] or g["toggle"])

    assert not {combo(t) for t in train} & {combo(t) for t in test}
    assert all(is_held_out(*combo(t)) for t in test)
    assert Counter(t.category for t in test[:12]) == Counter({k: 2 for k in TASK_TYPES})
    valid = load_tasks("household", "valid_seen", limit=60)
    assert {combo(t) for t in valid} <= {combo(t) for t in train} | {combo(t) for t in valid}
    assert not any(is_held_out(*combo(t)) for t in valid)


def test_generated_objects_sit_only_in_plausible_receptacles():
    assert is_plausible("knife", "drawer") and is_plausible("Knife", "CounterTop")
    assert not is_plausible("knife", "toilet")
    for split in ("train", "test"):
        for i in range(300):
            d = generate_task(split, i)
            rtype = {r["id"]: r["type"] for r in d["receptacles"]}
            for o in d["objects"]:
                assert o["type"] in CAN_CONTAIN[rtype[o["in"]]], (split, i, o)


def test_knobs_change_the_scene():
    small = load_tasks("household", "train", limit=30, receptacles=0.3, distractors=0)
    big = load_tasks("household", "train", limit=30, receptacles=1.0, distractors=16)
    assert sum(len(t.data["receptacles"]) for t in small) < sum(len(t.data["receptacles"]) for t in big)
    assert sum(len(t.data["objects"]) for t in small) < sum(len(t.data["objects"]) for t in big)
    opened = load_tasks("household", "train", limit=30, closed=0.0)
    assert all(r["opened"] for t in opened for r in t.data["receptacles"] if r["openable"])


def test_expert_solves_500_test_tasks_of_every_type():
    env = make_env("household")
    solved, lengths = Counter(), Counter()
    for task in load_tasks("household", "test", limit=3000):
        env.reset(task)
        result = None
        while result is None or not result.done:
            result = env.step(env.expert_reply())
        solved[task.category] += result.stop is StopReason.success
        lengths[task.category] += env.steps
    assert solved == Counter({k: 500 for k in TASK_TYPES})


def test_expert_replans_after_detours():
    w = World(_scene(), grammar="0.4")
    for command in ["go to countertop 1", "take mug 1 from countertop 1", "go to cabinet 1"]:
        w.step(command)
    plan = expert_plan(w)
    assert plan[0].startswith("open cabinet 1") or plan[0].startswith("move mug 1")
    for command in plan:
        assert w.step(command)[1].ok, command
    assert w.goal_reached()


def test_registry_lists_options():
    spec = get_env_spec("household")
    assert {o.name for o in spec.options} >= {"grammar", "hints", "format", "max_steps"}
    with pytest.raises(ValueError, match="no option 'colour'"):
        make_env("household", colour="red")
    with pytest.raises(ValueError, match="grammar"):
        make_env("household", grammar="0.5")


@pytest.mark.parametrize("knobs", [{}, {"receptacles": 0.5, "distractors": 4}])
def test_explorer_expert_solves_every_type_by_searching(knobs):
    env = make_env("household", expert="explorer")
    solved = Counter()
    for task in load_tasks("household", "test", limit=600, **knobs):
        env.reset(task)
        first = env.expert_reply().content
        # It starts by searching where the object can be, in listing order, not where it is.
        w = env.world
        target = w.goal["object"]
        plausible = [r.name for r in w.receptacles.values() if target in CAN_CONTAIN[r.type]]
        assert first.startswith("go to ") and first[len("go to "):] in plausible
        result = None
        while result is None or not result.done:
            result = env.step(env.expert_reply())
        solved[task.category] += result.stop is StopReason.success
    assert solved == Counter({k: 100 for k in TASK_TYPES})


def test_thoughts_goal_restates_the_goal_before_every_expert_action():
    """`thoughts=goal`: every expert reply is `THOUGHT: <the goal, one canonical line>` + the same ACTION the
    expert writes without thoughts; the format reads the action back; a format with no place for a thought is
    refused."""
    from turnforge.policies.base import Prompt
    from turnforge.policies.scripted import ExpertPolicy

    expected = {
        "pick_heat_then_place_in_recep": "heat a apple, then put it in countertop.",
        "look_at_obj_in_light": "examine the apple with the desklamp.",
        "pick_two_obj_and_place": "put two apple in countertop.",
        "pick_and_place_simple": "put a apple in countertop.",
    }
    games = {
        "pick_heat_then_place_in_recep": _scene(),
        "look_at_obj_in_light": _scene("look_at_obj_in_light", None, toggle="DeskLamp", receptacle=None),
        "pick_two_obj_and_place": _scene("pick_two_obj_and_place", None, count=2),
        "pick_and_place_simple": _scene("pick_and_place_simple", None),
    }
    for kind, game in games.items():
        task = Task(id=kind, env="household", split="test", category=kind, data=game)
        plain, thinking = make_env("household", expert="explorer"), make_env("household", expert="explorer", thoughts="goal")
        plain.reset(task), thinking.reset(task)
        for turn in range(3):
            prompt = Prompt(messages=[], task=task, sample=0, turn=turn, env=thinking)
            text = ExpertPolicy().generate([prompt], None)[0].text
            action = plain.expert_reply()
            assert text == f"THOUGHT: {expected[kind]}\nACTION: {action.content}"
            parsed = thinking.format.parse(text)
            assert parsed.content == action.content
            plain.step(action), thinking.step(parsed)
    # A tool format writes the thought as the free text before its call; the call is the action.
    task = Task(id="heat", env="household", split="test", category="pick_heat_then_place_in_recep", data=_scene())
    plain = make_env("household", expert="explorer", format="tool_call")
    tools = make_env("household", expert="explorer", thoughts="goal", format="tool_call")
    plain.reset(task), tools.reset(task)
    text = ExpertPolicy().generate([Prompt(messages=[], task=task, sample=0, turn=0, env=tools)], None)[0].text
    assert text.startswith("heat a apple, then put it in countertop.\n<tool_call>\n"), text
    assert tools.format.parse(text).tool_calls == plain.expert_reply().tool_calls
    with pytest.raises(ValueError, match="bfcl_python format has no place for a thought"):
        make_env("household", thoughts="goal", format="bfcl_python")
    with pytest.raises(ValueError, match="thoughts"):
        make_env("household", thoughts="plan")


def _noisy_episodes(tasks, noise, seed=0, max_open=64):
    from turnforge.policies.scripted import ExpertPolicy
    from turnforge.rollout import RolloutLimits, run_episodes

    make = lambda: make_env("household", expert="explorer", thoughts="goal", max_steps=30)  # noqa: E731
    return run_episodes(ExpertPolicy(noise=noise, seed=seed), make, tasks, 1, limits=RolloutLimits(max_open=max_open))


def test_a_noisy_expert_makes_marked_mistakes_and_recovers_from_them():
    """DART noise: about `noise` of the replies are mistakes (a repeat of the previous reply, a random
    admissible action, or a near miss), marked `learn=False`; the explorer goes on from where they leave it and
    still solves the tasks; the draws depend on (seed, task, sample, turn) only, not on what shares a batch."""
    tasks = load_tasks("household", "test", limit=120, receptacles=0.3, distractors=0)
    trajs = _noisy_episodes(tasks, noise=0.2)
    turns = [t for traj in trajs for t in traj.turns]
    mistakes = [t for t in turns if not t.learn]
    assert 0.15 < len(mistakes) / len(turns) < 0.25
    replies = [(traj.messages, i, t) for traj in trajs for i, t in zip(traj.reply_indices(), traj.turns, strict=True)]
    repeats = [t for msgs, i, t in replies if not t.learn and msgs[i].content == msgs[i - 2].content]
    slips = [t for msgs, i, t in replies
             if not t.learn and msgs[i].content != msgs[i - 2].content and msgs[i + 1].content == "Nothing happens."]
    detours = [t for msgs, i, t in replies
               if not t.learn and msgs[i].content != msgs[i - 2].content and msgs[i + 1].content != "Nothing happens."]
    for kind in (repeats, slips, detours):  # a third of the mistakes each
        assert 0.2 < len(kind) / len(mistakes) < 0.45, (len(repeats), len(slips), len(detours))
    assert sum(traj.score.success for traj in trajs) >= 0.97 * len(trajs)
    # every mistake still restates the goal, as the expert's own replies do
    assert all(t.text.startswith("THOUGHT: ") for t in mistakes)
    # the same episodes one at a time (other batches): the same mistakes
    again = _noisy_episodes(tasks[:20], noise=0.2, max_open=1)
    by_id = {traj.task_id: traj for traj in trajs}
    for traj in again:
        assert [(t.text, t.learn) for t in traj.turns] == [(t.text, t.learn) for t in by_id[traj.task_id].turns]
    # noise 0 is the expert itself
    clean = _noisy_episodes(tasks[:20], noise=0.0)
    assert all(t.learn for traj in clean for t in traj.turns)


def test_the_explorer_puts_down_an_object_a_mistake_took():
    checked = 0
    for task in load_tasks("household", "test", limit=200):
        env = make_env("household", expert="explorer")
        env.reset(task)
        result = None
        for _turn in range(30):
            w = env.world
            wrong = [a for a in env.admissible_actions()
                     if a.startswith("take ") and w.objects[a.split(" from ")[0][5:]].type != w.goal["object"]]
            if wrong:
                break
            result = env.step(env.expert_reply())
            if result.done:
                break
        if not wrong or (result is not None and result.done):
            continue
        taken = wrong[0].split(" from ")[0][5:]
        env.step(env.action_message(wrong[0]))
        put = env.expert_reply().content
        assert put == f"put {taken} in/on {env.world.at}", put
        while result is None or not result.done:
            result = env.step(env.expert_reply())
        assert result.stop is StopReason.success
        checked += 1
    assert checked >= 20


def test_expert_noise_settings_are_checked():
    from turnforge.policies import make_policy
    from turnforge.policies.scripted import ExpertPolicy
    from turnforge.stages.collect import CollectStage

    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        ExpertPolicy(noise=1.0)
    with pytest.raises(ValueError, match="policy expert does not take window"):
        make_policy("expert", window=3)
    assert make_policy("expert", noise=0.1, seed=3).noise == 0.1
    with pytest.raises(ValueError, match="noise perturbs the expert"):
        CollectStage(policy="random", noise=0.1)


def test_near_misses_are_the_commands_that_look_valid_here_and_fail():
    w = World(_scene(), grammar="0.3")
    w.step("go to countertop 1")
    w.step("take mug 1 from countertop 1")
    w.step("go to microwave 1")
    assert w.near_misses() == [
        "clean mug 1 with microwave 1", "close microwave 1", "cool mug 1 with microwave 1",  # this place's verbs
        "examine microwave 2", "examine mug 2", "go to cabinet 2", "go to countertop 3", "go to fridge 2",
        "go to microwave 1",  # where the agent stands
        "go to sinkbasin 2", "heat mug 1 with microwave 2", "heat mug 2 with microwave 1",  # numbers one off
        "open microwave 2", "put mug 1 in/on microwave 1",  # into a closed microwave
    ]
    for command in w.near_misses():
        assert w.check(command).ok is False


@pytest.mark.parametrize("kind", ["pick_heat_then_place_in_recep", "look_at_obj_in_light", "pick_two_obj_and_place"])
def test_thoughts_search_state_where_the_search_is_and_leave_the_actions_alone(kind):
    """`thoughts=search`: the goal line + "searching R." for the receptacle the explorer goes to (or opens) in
    its search, which decides its next `go to`; nothing while it carries the goal object to its place. The
    actions are those of `thoughts=goal`."""
    from turnforge.policies.scripted import ExpertPolicy
    from turnforge.rollout import run_episodes

    task = next(t for t in load_tasks("household", "train", limit=100) if t.category == kind)
    episodes = {
        thoughts: run_episodes(ExpertPolicy(), lambda t=thoughts: make_env("household", expert="explorer", thoughts=t),
                               [task], 1, progress=False)[0]
        for thoughts in ("goal", "search")
    }
    goal, search = episodes["goal"], episodes["search"]
    assert search.score.success and [t.text.split("\nACTION: ")[1] for t in search.turns] == [
        t.text.split("\nACTION: ")[1] for t in goal.turns]
    searched = 0
    for g, s in zip(goal.turns, search.turns, strict=True):
        thought, action = s.text.removeprefix("THOUGHT: ").split("\nACTION: ")
        assert thought.startswith(g.text.removeprefix("THOUGHT: ").split("\nACTION: ")[0])
        note = thought.split(". ", 1)[1] if ". " in thought else ""
        if action.startswith(("go to ", "open ")) and note:
            target = action.removeprefix("go to ").removeprefix("open ")
            assert note == f"searching {target}.", s.text
            searched += 1
        if action.startswith(("heat ", "put ")):
            assert note == "", s.text  # carrying the goal object: no search under way
    assert searched >= 1
    with pytest.raises(ValueError, match="explorer"):
        make_env("household", thoughts="search")


@pytest.mark.parametrize("knobs", [Knobs(), Knobs(receptacles=0.3, distractors=0), Knobs(receptacles=0.5, distractors=20)])
def test_entity_names_hold_every_name_a_generated_room_shows(knobs):
    """`entity_names` is the tokenizer's list of whole names: no generated room may show one it lacks."""
    names = set(entity_names(knobs))
    shown = set()
    for split in SPLITS:
        for task in generate_split(split, 400, knobs=knobs):
            ids = [r["id"] for r in task["receptacles"]] + [o["id"] for o in task["objects"]]
            shown |= set(display_names(ids).values()) | {f"loc {r['loc']}" for r in task["receptacles"]}
    assert shown <= names, sorted(shown - names)
    assert len(shown) > 100


def test_the_explorer_searches_on_from_what_other_replies_looked_into():
    """Replies not its own (a model's, between expert-guided turns) looked into the first two receptacles the
    search would visit; the explorer then goes to the third, not back to the first, and still solves the task."""
    checked = 0
    for task in load_tasks("household", "test", limit=200):
        if task.category != "pick_and_place_simple":
            continue
        env = make_env("household", expert="explorer")
        env.reset(task)
        w = env.world
        plausible = [r for r in w.receptacles.values()
                     if w.goal["object"] in CAN_CONTAIN[r.type] and r.type != w.goal["receptacle"]]
        if len(plausible) < 3 or any(w.objects[o].type == w.goal["object"] for r in plausible[:2] for o in r.contents):
            continue
        for rec in plausible[:2]:  # the "model" searches them itself
            env.step(env.action_message(f"go to {rec.name}"))
            if rec.openable and not rec.opened:
                env.step(env.action_message(f"open {rec.name}"))
        assert env.expert_reply().content == f"go to {plausible[2].name}"
        result = None
        while result is None or not result.done:
            result = env.step(env.expert_reply())
        assert result.stop is StopReason.success
        checked += 1
    assert checked >= 5
