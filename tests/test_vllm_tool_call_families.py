"""turnforge's tool-call formats read what vLLM's parser for each family reads: benchmarks/tool_call_parsers.py's 200
seeded replies per family, and hand-written edge replies, through both parsers.

    .venv-vllm/bin/python -m pytest -m vllm tests/test_vllm_tool_call_families.py -q
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from vllm_engines import needs_vllm

pytestmark = [pytest.mark.vllm, needs_vllm]

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

KNOWN = {"hermes": {"cut_off": 3}, "glm4": {"cut_off": 24}, "phi4_mini": {"nested": 25}, "qwen3_xml": {"cut_off": 22},
         "gemma4": {"nested": 25, "cut_off": 25}}
"""Known disagreements per family and kind. hermes: replies cut inside the closing tag (`...}}\\n</tool`), whose JSON
is whole: turnforge's lenient parse reads the call, vLLM's reads none (BENCHMARKS.md, tool-call parsers). glm4: replies
cut inside a block once the name is written: vLLM reads the unfinished call with the arguments finished so far,
turnforge none (tool_call_glm4's docstring). phi4_mini: arguments holding a list: vLLM ends the call list at the first
`]` and reads none, turnforge the whole list (tool_call_phi4_mini's docstring). qwen3_xml: replies cut inside a call
once `<function=` has a character after it: vLLM reads the unfinished call (name maybe half written) with the parameters
closed so far, turnforge none (tool_call_qwen3_xml's docstring). gemma4: nested bare values no schema types
(`id:5` in an `object` property without `properties`, `[true,null,1.5]` without `items`): vLLM passes the text on
("5", "true", "null"), turnforge reads them as written; and cut-off replies: vLLM reads the unfinished call, turnforge
none (tool_call_gemma4's docstring)."""

Q, GS, GE = '<|"|>', "<|tool_call>", "<tool_call|>"  # Gemma 4's string quote and call tags
EDGES = {
    "llama3": [
        'Use {braces} then {"name": "act", "parameters": {}}',
        '{"name": "act", "parameters": {}}; {"name": "b", "param',
        '{"name": "a", "parameters": {}}\n\n{"name": "b", "arguments": {"x": "}"}} trailing',
        '<|python_tag|>{"name": "act", "parameters": {"a": 1}}',
        '{"action": "look"}', '{"name": "act"}', "no call here", '{"name": 3, "parameters": {}}', "{}",
    ],
    "lfm2": [
        '<|tool_call_start|>[f(text="line1\nline2\tx")]<|tool_call_end|>',  # raw newline and tab inside a string
        "<|tool_call_start|>[f(month=07, day=1e07, x=0x1F, y=00)]<|tool_call_end|>",
        "<|tool_call_start|>[memory_get(from=1, to=2)]<|tool_call_end|>",
        "<|tool_call_start|>[f(a=true, b=null, c=(1, 2), d={3}, e=-4, f=f'x', g=+1.5)]<|tool_call_end|>",
        "<|tool_call_start|>[a.b.c(x='y')]<|tool_call_end|>after",
        "<|tool_call_start|>[f(x=1)]<|tool_call_end|>f(x=1)]<|tool_call_end|> the rest",
        "<|tool_call_start|>[f(x=1)]<|tool_call_end|> and <|tool_call_start|>[g(y=2)]<|tool_call_end|>",
        "<|tool_call_start|>[f(x=1)]", "<|tool_call_start|>[]<|tool_call_end|>", "<|tool_call_start|>[1]<|tool_call_end|>",
        "<|tool_call_start|>f(x=1)<|tool_call_end|>", "<|tool_call_start|>[f(x=y)]<|tool_call_end|>",
        "<|tool_call_start|>[f(x=b'1')]<|tool_call_end|>", "<|tool_call_start|>[f(x={1: 2, None: 3})]<|tool_call_end|>",
        "<|tool_call_start|>[f(x=1), [g()]]<|tool_call_end|>", "[f(x=1)]", "<|tool_call_start|> [f(x=\"a]\")] <|tool_call_end|>",
    ],
    "glm4": [
        "<tool_call>act\n<arg_key>action</arg_key>\n<arg_value>look</arg_value>\n</tool_call>\n<tool_call>nosuch\n</tool_call>",
        "<tool_call>nosuch\n<arg_key>action</arg_key>\n<arg_value>look</arg_value>\n</tool_call>",
        "<tool_call>act<arg_key> n </arg_key><arg_value> 2 </arg_value></tool_call>after text",
        "<tool_call>act\n<arg_key>n</arg_key>\n<arg_value>two</arg_value>\n<arg_key>zzz</arg_key>\n<arg_value>[1]</arg_value>\n"
        "</tool_call>",
        "<tool_call>act\n<arg_key>n</arg_key> junk <arg_value>2</arg_value>\n</tool_call>",
        "<tool_call>act\nstray<arg_key>n</arg_key>\n<arg_value>2</arg_value>\n</tool_call>", "<tool_call>\n</tool_call>",
        "<tool_call>act\n<arg_key>n</arg_key>\n<arg_value>2</arg_value>\n<arg_key>n</arg_key>\n<arg_value>3</arg_value>\n"
        "</tool_call>",
        "think first</think>text<tool_call>act\n</tool_call>", "<tool_call>act <tool_call>act\n</tool_call>",
        '<think>hmm</think>\n<tool_call>act\n<arg_key>order</arg_key>\n<arg_value>{"a": 1}</arg_value>\n</tool_call>',
        "<tool_call>act\n<arg_key>n</arg_key>\n<arg_value>null</arg_value>\n<arg_key>city</arg_key>\n<arg_value>null"
        "</arg_value>\n</tool_call>",
        "<tool_call>act\n<arg_key>n</arg_key>\n<arg_value>1.0</arg_value>\n<arg_key>flags</arg_key>\n<arg_value>x"
        "</arg_value>\n</tool_call>",
    ],
    "qwen3_xml": [
        "<tool_call>\n<function=act>\n<parameter=n>\n2\n</parameter>\n<parameter=action>\nlook\n</parameter>\n</function>\n"
        "</tool_call>",
        "<tool_call>\n<function=act>\n<parameter=n>\ntwo\n</parameter>\n<parameter=zzz>\n[1]\n</parameter>\n"
        "<parameter=order>\nnot json\n</parameter>\n<parameter=flags>\n[1, 2]\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=nosuch>\n<parameter=n>\n2\n</parameter>\n</function>\n</tool_call>",
        "I think.\n\n<tool_call>\n<function=act>\n</function>\n</tool_call>\n<tool_call>\n<function=act>\n</function>\n"
        "</tool_call> Done.",
        "<function=act>\n<parameter=n>\n3\n</parameter>\n</function>",
        "<tool_call>\n<function=act>\n<parameter=n>\n3\n</parameter>\n</function>",
        "<tool_call>\n<function=act>\n</function>\n<tool_call>\n<function=act>\n</function>\n</tool_call>",
        "<tool_call>\n<function=act>\n<parameter=n>\n3\n<parameter=action>\nlook\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\njunk<function=act>\nstray<parameter=n>\n3\n</parameter>\nx\n</function>junk\n</tool_call>",
        "<tool_call>\n<function= act >\n<parameter= n >\n3\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=act>\n<parameter=action>\n\n\nx\n\n\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=act>\n<parameter=action>a > b </tool_call> <tool_call> c</parameter>\n</function>\n"
        "</tool_call>",
        "<tool_call>\n<function=act</function>\n</tool_call>", "<tool_call>\n<function=a</parameter>b>\n</function>\n"
        "</tool_call>", "<tool_call>\n</tool_call>", '<tool_call>\n{"name": "act", "arguments": {}}\n</tool_call>',
        "<tool_call>\n<function=>\n</function>\n</tool_call>", "<tool_call>", "<function=", "</function>", "no call",
        "<tool_call>\n<function=act>\n<parameter=n>\n1\n</parameter>\n<parameter=n>\n2\n</parameter>\n</function>\n"
        "</tool_call>",
        "<think>hmm</think>\n<tool_call>\n<function=act>\n<parameter=n>\n4\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=act>\n<parameter=n>\nnull\n</parameter>\n<parameter=city>\nnull\n</parameter>\n"
        "<parameter=flags>\nnull\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=act>\n<parameter=n>\nTrue\n</parameter>\n<parameter=action>\nNone\n</parameter>\n"
        "<parameter=n>\n 5 \n</parameter>\n<parameter=flags>\nx\n</parameter>\n</function>\n</tool_call>",
    ],
    "phi4_mini": [
        'I will call.\nfunctools[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "parameters": {}}] then text',
        'functools[{"name": "a", "arguments": {"x": 1}}] functools[{"name": "b", "arguments": {}}]',
        "functools[]", "functools[1]", 'functools[{"name": "a"}]', 'functools[{"name": 1, "arguments": {}}]',
        'functools[{"name": "a", "arguments": {"x": 1}', "functools [{}]", "no call",
    ],
}
EDGES["gemma4"] = [
    f"{GS}call:act{{action:{Q}look{Q},n:2}}{GE}",
    f"{GS}call:act{{n:{Q}7{Q},action:5,city:{Q}a,b:c{Q}}}{GE}",  # typed by the schema: "7" -> 7, 5 -> "5"
    f"{GS}call:act{{}}{GE}{GS}call:act{{n:1}}{GE}",
    f"Sure.{GS}call:act{{n:1}}{GE} and then {GS}call:act{{n:2}}{GE}Done.",
    f"{GS}call:act{GE}", f"{GS}:act{{n:3}}{GE}", f"{GS}call:act(n:3){GE}",
    f"{GS}call:act{{ n : 3 , action : {Q}x{Q} }}{GE}", f"{GS}call:act{{{Q}action{Q}:{Q}q{Q}}}{GE}",
    f"{GS}call:act{{n:true,action:null}}{GE}", f"{GS}call:act{{n:}}{GE}",
    f"<|channel>thought\nhmm<channel|>{GS}call:act{{n:4}}{GE}",
    f"{GS}call:act{{text:{Q}a}}b{{c{Q}}}{GE}",  # braces inside a string
    "no call here", "call:act{n:1}", GE,
]
EDGES["granite4"] = [
    '<tool_call>\n{"name": "act", "arguments": {"n": 1}}\n</tool_call>',
    'Hi <tool_call>{"name": "a", "arguments": {}}</tool_call> mid <tool_call>{"name": "b", "arguments": {"x": [1]}}'
    "</tool_call> end",
    '<tool_call>{"name": "a", "arguments": "{\\"x\\": 1}"}</tool_call>',
    '<tool_call>{"name": "a", "arguments": {}, "id": 3}</tool_call>',
    '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {}',  # cut off: none
    '<tool_call><tool_call>{"name": "a", "arguments": {}}</tool_call>', "</tool_call>", "<tool_call></tool_call>",
    "<tool_call>{'name': 'a', 'arguments': {}}</tool_call>", '<tool_call>{"name": "a"}</tool_call>',
    '<tool_call>{"arguments": {}}</tool_call>', "<tool_call>[1]</tool_call>",
    '<tool_call>{"name": 3, "arguments": {}}</tool_call>', '<tool_call>{"name": "a", "arguments": null}</tool_call>',
    '<tool_call>```json\n{"name": "a", "arguments": {}}\n```</tool_call>', "no call",
]
KNOWN_EDGES = {
    "glm4": ["<tool_call>act\n<arg_key>action</arg_key>\n<arg_value>lo"],  # cut off: vLLM reads act({})
    "phi4_mini": ['functools[{"name": "a", "arguments": {"x": "]"}}]'],  # vLLM cuts at the first ]
    "qwen3_xml": ["<tool_call>\n<function=act>",  # cut off: vLLM reads act({})
                  "<tool_call>\n<function=act>\n</function>\n</tool_call>\n<tool_call>\n</tool_call>",  # no function
                  "<tool_call>\n<function=act>\n<parameter=n>\n3\n</function>\n</tool_call>"],  # vLLM drops n
    "lfm2": ["<|tool_call_start|>[f(1, x=2)]<|tool_call_end|>",  # vLLM drops the positional 1; turnforge refuses
             "<|tool_call_start|>[run(cmd='sed -n '1,9p' f.py')]<|tool_call_end|>"],  # vLLM's nested-quote guess
    "gemma4": [f"{GS}call:act{{order:{{a:{{b:[1,{Q}]{Q},{{c:null}}]}}}},flags:[]}}{GE}",  # vLLM: "1", "null"
               f"{GS}call:nosuch{{n:2}}{GE}",  # no schema: vLLM "2", turnforge 2
               f"{GS}call:act{{n:1}}", f"{GS}call:act{{n:1}}{GE}{GS}"],  # cut off: vLLM reads act({"n": 1})
    "granite4": ['<tool_call>{"name": "a", "arguments": [1]}</tool_call>',  # vLLM passes [1] on; turnforge refuses
                 '<tool_call>{"name": "a", "arguments": 3}</tool_call>'],
}
"""EDGES: replies the generator does not write, each read the same by both parsers; KNOWN_EDGES: read differently, as
each format's docstring says."""


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    logging.getLogger("vllm").setLevel(logging.CRITICAL)
    import tool_call_parsers

    yield tool_call_parsers
    sys.path.remove(str(BENCHMARKS))


@pytest.mark.parametrize("family", ["hermes", "llama3", "lfm2", "glm4", "phi4_mini", "qwen3_xml", "gemma4", "granite4"])
def test_generated_replies_read_alike(bench, family):
    rows = bench.compare(bench.FAMILIES[family], 200, 0)
    disagree = {}
    for row in rows:
        if not row["agree"]:
            disagree[row["kind"]] = disagree.get(row["kind"], 0) + 1
    assert disagree == KNOWN.get(family, {}), [r for r in rows if not r["agree"]][:3]


@pytest.mark.parametrize("family", sorted(EDGES))
def test_edge_replies_read_alike(bench, family):
    spec = bench.FAMILIES[family]
    texts = EDGES[family]
    read = bench.vllm_reader(spec, texts)
    fmt = bench.turnforge_format(spec)
    for text in texts:
        assert bench.turnforge_reads(fmt.parse(text)) == read(text), text
    for text in KNOWN_EDGES.get(family, []):
        theirs = read(text)
        assert bench.turnforge_reads(fmt.parse(text)) != theirs, text  # still the documented disagreement
