"""Service env test helpers: `ok` / `err` call a toolkit expecting success (the parsed JSON, or the text) / an error
text; `ScriptedUserModel` stands for a model playing the user."""

from __future__ import annotations

import json

from turnforge.types import Generation


def ok(tools, name, **args):
    result = tools.call(name, args)
    assert not result.error, result.content
    try:
        return json.loads(result.content)
    except json.JSONDecodeError:
        return result.content


def err(tools, name, **args) -> str:
    result = tools.call(name, args)
    assert result.error
    return result.content


class ScriptedUserModel:
    """A user model that replies these texts in order (the role client's `generate(messages, tools)`), recording
    what it was shown."""

    def __init__(self, texts):
        self.texts, self.calls = list(texts), []

    def generate(self, messages, tools=None):
        self.calls.append((messages, tools))
        return Generation(text=self.texts.pop(0), ids=[1, 2])  # two tokens a reply
