"""Tool-call parsers against the real chat templates of Qwen2.5, Qwen3, GLM-4.5 and Llama 3.1.

Each round trip renders an assistant message through the family's own template, cuts the reply
out of the rendering as the model would have generated it (up to its stop token), sends it
through the family's tokenizer and back (special tokens kept), and parses it to the same calls.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jinja2 import TemplateError

from sandrl.errors import ConfigError
from sandrl.inference.toolcalls import (
    PARSERS,
    ParsedReply,
    ToolCall,
    check_calls,
    detect_parser,
    get_parser,
    split_reasoning,
)

from ..chat_families import FAMILIES, spec, template

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the sandbox.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
                "required": ["command"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}, "mode": {"type": "integer"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the code.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "options": {"type": "object"},
                    "paths": {"type": "array"},
                    "exact": {"type": "boolean"},
                    "limit": {"type": ["integer", "null"]},
                    "order": {"type": "string", "enum": ["name", "score"]},
                },
                "required": ["query"],
            },
        },
    },
]

LS = ToolCall("bash", {"command": "ls -la /workspace", "timeout": 30})
WRITE = ToolCall(
    "write_file",
    {"path": "/workspace/naïve ✓.py", "content": 'print("héllo, 世界")\nx = {"a": [1, 2]}\n\tdone\\n', "mode": 420},
)
SEARCH = ToolCall(
    "search",
    {
        "query": "def main",
        "options": {"depth": 2, "filters": ["*.py", "!tests/"], "nested": {"k": None}},
        "exact": True,
    },
)


@pytest.fixture(scope="module")
def hf_tokenizer(family_tokenizer_dir: Callable[[str], Path]) -> Callable[[str], Any]:
    from transformers import AutoTokenizer

    loaded: dict[str, Any] = {}

    def get(family: str) -> Any:
        if family not in loaded:
            loaded[family] = AutoTokenizer.from_pretrained(str(family_tokenizer_dir(family)), local_files_only=True)
        return loaded[family]

    return get


def _generated(tok: Any, family: str, assistant: dict[str, Any]) -> str:
    """What the model generated for ``assistant``: its rendering after the generation prompt, up to the stop token."""
    history = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Fix the bug."}]
    prompt = tok.apply_chat_template(history, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    full = tok.apply_chat_template([*history, assistant], tools=TOOLS, tokenize=False)
    assert full.startswith(prompt), "the template re-renders the prompt differently once the reply is added"
    reply = full[len(prompt) :]
    turn_end = spec(family).turn_end
    if turn_end is not None:
        reply, end, after = reply.rpartition(turn_end)
        assert end and not after.strip(), f"the reply does not end with {turn_end}: {after!r}"
    ids = tok.encode(reply, add_special_tokens=False)
    decoded = str(tok.decode(ids, skip_special_tokens=False))
    assert decoded == reply, "decoding the reply's tokens does not give its text back"
    return decoded


def _assistant(calls: list[ToolCall], content: str = "", reasoning: str | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": [c.for_template() for c in calls]}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def _same_calls(parsed: ParsedReply, calls: list[ToolCall]) -> None:
    assert parsed.errors == ()
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [(c.name, c.arguments) for c in calls]
    assert [c.id for c in parsed.tool_calls] == [f"call_{i}" for i in range(len(calls))]
    assert check_calls(parsed.tool_calls, TOOLS) == ()


# -- round trips through the real templates ---------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("call", [LS, WRITE, SEARCH], ids=["plain", "unicode-quotes-newlines", "nested-json"])
def test_one_rendered_call_parses_back(family: str, call: ToolCall, hf_tokenizer: Callable[[str], Any]) -> None:
    reply = _generated(hf_tokenizer(family), family, _assistant([call]))
    parsed = get_parser(spec(family).parser).parse(reply, tools=TOOLS)
    _same_calls(parsed, [call])
    assert parsed.content == ""


@pytest.mark.parametrize("family", ["qwen2.5", "qwen3", "glm45"])
def test_several_rendered_calls_with_text_parse_back(family: str, hf_tokenizer: Callable[[str], Any]) -> None:
    calls = [LS, WRITE, SEARCH]
    reply = _generated(hf_tokenizer(family), family, _assistant(calls, content="I will look around first."))
    parsed = get_parser(spec(family).parser).parse(reply, tools=TOOLS)
    _same_calls(parsed, calls)
    assert parsed.content == "I will look around first."


@pytest.mark.parametrize("family", ["qwen3", "glm45"])
def test_reasoning_is_split_off(family: str, hf_tokenizer: Callable[[str], Any]) -> None:
    thought = "The bug is in main.py.\nList the files first."
    reply = _generated(hf_tokenizer(family), family, _assistant([LS], content="Listing.", reasoning=thought))
    parsed = get_parser(spec(family).parser).parse(reply, tools=TOOLS)
    _same_calls(parsed, [LS])
    assert (parsed.reasoning, parsed.content) == (thought, "Listing.")


@pytest.mark.parametrize(("family", "reasoning"), [("qwen2.5", None), ("qwen3", ""), ("glm45", ""), ("llama3.1", None)])
def test_a_reply_without_reasoning(family: str, reasoning: str | None, hf_tokenizer: Callable[[str], Any]) -> None:
    """Qwen3 and GLM-4.5 render an empty think block in the last assistant turn even without reasoning."""
    reply = _generated(hf_tokenizer(family), family, _assistant([LS]))
    assert get_parser(spec(family).parser).parse(reply).reasoning == reasoning


def test_llama_drops_the_text_of_a_tool_call_turn_and_takes_one_call(hf_tokenizer: Callable[[str], Any]) -> None:
    tok = hf_tokenizer("llama3.1")
    reply = _generated(tok, "llama3.1", _assistant([LS], content="This text is not rendered."))
    assert reply == '{"name": "bash", "parameters": {"command": "ls -la /workspace", "timeout": 30}}'
    with pytest.raises(TemplateError, match="only supports single tool-calls"):
        _generated(tok, "llama3.1", _assistant([LS, WRITE]))


def test_llama_calls_after_the_python_tag_and_separated_by_semicolons() -> None:
    calls = [LS, WRITE, SEARCH]
    joined = "; ".join(json.dumps({"name": c.name, "parameters": c.arguments}, ensure_ascii=False) for c in calls)
    parser = get_parser("llama3_json")
    _same_calls(parser.parse(joined), calls)
    tagged = parser.parse("Checking first.<|python_tag|>" + joined + "\nthen I will report")
    _same_calls(tagged, calls)
    assert tagged.content == "Checking first.\nthen I will report"
    aliased = parser.parse('{"name": "bash", "arguments": {"command": "ls"}}\n{"name": "bash", "parameters": {}}')
    assert [c.arguments for c in aliased.tool_calls] == [{"command": "ls"}, {}]


def test_glm_keeps_string_arguments_raw_when_the_tools_say_string() -> None:
    reply = (
        "<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>123</arg_value>\n"
        "<arg_key>content</arg_key>\n<arg_value>true</arg_value>\n<arg_key>mode</arg_key>\n<arg_value>420</arg_value>\n"
        "</tool_call>"
    )
    glm = get_parser("glm45")
    assert glm.parse(reply, tools=TOOLS).tool_calls[0].arguments == {"path": "123", "content": "true", "mode": 420}
    assert glm.parse(reply).tool_calls[0].arguments == {"path": 123, "content": True, "mode": 420}
    quoted = glm.parse('<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>"ls"</arg_value>\n</tool_call>')
    assert quoted.tool_calls[0].arguments == {"command": '"ls"'}, "a JSON string is how the template writes '\"ls\"'"


def test_glm_variants_without_newlines_or_with_escaped_ones() -> None:
    glm = get_parser("glm45")
    for reply in (
        "<tool_call>bash<arg_key>command</arg_key><arg_value>ls</arg_value></tool_call>",  # GLM-4.7
        "<tool_call>bash\\n<arg_key>command</arg_key>\\n<arg_value>ls</arg_value>\\n</tool_call>",
    ):
        _same_calls(glm.parse(reply), [ToolCall("bash", {"command": "ls"})])


# -- what the templates do around the reply ---------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_what_follows_a_reply_in_the_conversation_is_a_stop_token(
    family: str, hf_tokenizer: Callable[[str], Any]
) -> None:
    """The token after the assistant's calls in the rendered conversation is one of the model's eos ids."""
    tok = hf_tokenizer(family)
    messages = [
        {"role": "user", "content": "Fix the bug."},
        _assistant([LS]),
        {"role": "tool", "tool_call_id": "call_0", "content": "main.py\nREADME.md"},
    ]
    rendered = tok.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    call_end = _generated(tok, family, _assistant([LS]))[-20:]  # Qwen3 renders the turn's start otherwise now
    after = rendered[rendered.rindex(call_end) + len(call_end) :]
    first = tok.convert_ids_to_tokens(tok.encode(after, add_special_tokens=False)[:1])[0]
    assert first in spec(family).generation_eos
    assert first == (spec(family).turn_end or "<|observation|>")


@pytest.mark.parametrize(
    ("family", "kept"), [("qwen2.5", True), ("qwen3", False), ("glm45", False), ("llama3.1", True)]
)
def test_earlier_turns_are_rendered_again_unchanged_only_by_some_templates(
    family: str, kept: bool, hf_tokenizer: Callable[[str], Any]
) -> None:
    """Qwen3 and GLM-4.5 drop the reasoning of turns before the last user message: not prefix-preserving."""
    tok = hf_tokenizer(family)
    first = [{"role": "user", "content": "q1"}, _assistant([LS], content="Looking.", reasoning="think")]
    later = [*first, {"role": "tool", "content": "out"}, {"role": "assistant", "content": "Done."}]
    later.append({"role": "user", "content": "q2"})
    before = tok.apply_chat_template(first, tools=TOOLS, tokenize=False)
    after = tok.apply_chat_template(later, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert after.startswith(before.rstrip()) is kept


def test_qwen3_drops_an_empty_think_block_once_a_tool_response_follows(hf_tokenizer: Callable[[str], Any]) -> None:
    """What Qwen3 generated after an empty think block is not what its template renders for that turn later."""
    tok = hf_tokenizer("qwen3")
    reply = _generated(tok, "qwen3", _assistant([LS]))
    assert reply.startswith("<think>\n\n</think>\n\n<tool_call>")
    later = [{"role": "user", "content": "Fix the bug."}, _assistant([LS]), {"role": "tool", "content": "out"}]
    rendered = tok.apply_chat_template(later, tools=TOOLS, tokenize=False)
    assert "<|im_start|>assistant\n<tool_call>" in rendered and "<think>" not in rendered


# -- malformed replies ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("parser", "reply", "calls", "error"),
    [
        ("hermes", '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}\n</tool_call>', 0,
         r"^tool call 1 is not valid JSON: Expecting ',' delimiter"),
        ("hermes", '<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}', 1,
         r"^tool call 1 is not closed: end it with </tool_call>\.$"),
        ("hermes", '<tool_call>\n{"name": "bash", "argu', 0,
         r"^tool call 1 is not closed with </tool_call> and is not valid JSON"),
        ("hermes", '<tool_call>{"arguments": {}}</tool_call>', 0, r'^tool call 1 has no "name"'),
        ("hermes", '<tool_call>{"name": "bash", "arguments": [1]}</tool_call>', 0,
         r'"arguments" that are not a JSON object'),
        ("hermes", "<tool_call>[1, 2]</tool_call>", 0, r"^tool call 1 must be a JSON object, got \[1, 2\]"),
        ("hermes", "<tool_call>" + "[" * 5000 + "</tool_call>", 0, r"nested too deeply"),
        ("glm45", "<tool_call>\n<arg_key>command</arg_key>\n<arg_value>ls</arg_value>\n</tool_call>", 0,
         r"^tool call 1 has no tool name"),
        ("glm45", "<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>ls\n</tool_call>", 0,
         r"value of 'command' not closed with </arg_value>"),
        ("glm45", "<tool_call>bash\nplease run ls\n</tool_call>", 0, r"unexpected text 'please run ls"),
        ("glm45", "<tool_call>bash\n<arg_key>command</arg_key>\n<arg_value>ls</arg_value>", 1,
         r"^tool call 1 is not closed: end it with </tool_call>\.$"),
        ("glm45", "<tool_call>bash\n<arg_key>command</arg_key>\n<arg_val", 0,
         r"^tool call 1 is not closed with </tool_call> and \(bash\) has no <arg_value>"),
        ("llama3_json", '<|python_tag|>{"name": "bash", "parameters": {"command": "ls"}', 0,
         r"^tool call 1 is not valid JSON: Expecting ',' delimiter"),
        ("llama3_json", '{"name": "bash", "parameters": {"command": "ls"}}; {"name": "bash", "para', 1,
         r"^tool call 2 is not valid JSON"),
        ("llama3_json", '{"name": "bash", "parameters": "ls"}', 0, r'"parameters" that are not a JSON object'),
        ("llama3_json", "<|python_tag|>brave_search.call(query=\"x\")", 0, r"^tool call 1 is not valid JSON"),
    ],
)  # fmt: skip
def test_a_malformed_call_is_an_error_for_the_model(parser: str, reply: str, calls: int, error: str) -> None:
    parsed = get_parser(parser).parse(reply)
    assert len(parsed.tool_calls) == calls
    assert len(parsed.errors) == 1, parsed.errors
    assert re.search(error, parsed.errors[0]), parsed.errors[0]


def test_a_bad_call_does_not_spoil_the_next_one() -> None:
    reply = "Trying.\n<tool_call>\n{bad}\n</tool_call>\nthen\n<tool_call>\n" + json.dumps(
        {"name": "bash", "arguments": {"command": "pwd"}}
    ) + "\n</tool_call>\nDone."  # fmt: skip
    parsed = get_parser("hermes").parse(reply)
    assert parsed.tool_calls == (ToolCall("bash", {"command": "pwd"}, "call_0"),)
    assert len(parsed.errors) == 1 and parsed.errors[0].startswith("tool call 1 is not valid JSON")
    assert parsed.content == "Trying.\n\nthen\n\nDone."


def test_text_after_an_unclosed_call_stays_in_place() -> None:
    reply = 'a <tool_call>{"name": "bash", "arguments": {}} b <tool_call>{"name": "ls", "arguments": {}}</tool_call> c'
    parsed = get_parser("hermes").parse(reply)
    assert parsed.content == "a  b  c"
    assert [c.name for c in parsed.tool_calls] == ["bash", "ls"]
    assert parsed.errors == ("tool call 1 is not closed: end it with </tool_call>.",)


@pytest.mark.parametrize(
    ("text", "reasoning", "rest"),
    [
        ("<think>\nplan\n</think>\n\nanswer", "plan", "\n\nanswer"),
        ("plan opened by the prompt</think>answer", "plan opened by the prompt", "answer"),
        ("<think>cut short while thinking", "cut short while thinking", ""),
        ("<think>no close<tool_call>x</tool_call>", "no close", "<tool_call>x</tool_call>"),
        ("none <tool_call>{}</tool_call> ends </think>", None, "none <tool_call>{}</tool_call> ends </think>"),
    ],
)  # fmt: skip
def test_split_reasoning(text: str, reasoning: str | None, rest: str) -> None:
    assert split_reasoning(text, "<tool_call>") == (reasoning, rest)


@pytest.mark.parametrize("reply", ["Just an answer.", '{"result": 3, "ok": true}', "{not json and no call}", "", "   "])
def test_llama_text_that_is_no_call_is_content(reply: str) -> None:
    parsed = get_parser("llama3_json").parse(reply)
    assert (parsed.content, parsed.tool_calls, parsed.errors) == (reply.strip(), (), ())


# -- checking calls against the tools ---------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (ToolCall("rm", {}), "tool call 1 names an unknown tool 'rm'; the tools are: bash, search, write_file."),
        (ToolCall("bash", {"timeout": 5}), "tool call 1 (bash) is missing the required argument 'command'."),
        (ToolCall("bash", {"command": "ls", "timeout": "10"}),
         "tool call 1 (bash): argument 'timeout' must be an integer, got a string ('10')."),
        (ToolCall("bash", {"command": "ls", "timeout": True}),
         "tool call 1 (bash): argument 'timeout' must be an integer, got a boolean (true or false) (True)."),
        (ToolCall("bash", {"command": "ls", "cwd": "/"}),
         "tool call 1 (bash) has an unexpected argument 'cwd'; it takes 'command', 'timeout'."),
        (ToolCall("search", {"query": "x", "order": "date"}),
         "tool call 1 (search): argument 'order' must be one of 'name', 'score', got 'date'."),
        (ToolCall("search", {"query": "x", "limit": "all"}),
         "tool call 1 (search): argument 'limit' must be an integer or null, got a string ('all')."),
        (ToolCall("search", {"query": ["x"], "exact": "yes"}),
         "tool call 1 (search): argument 'query' must be a string, got an array (['x'])."),
    ],
)  # fmt: skip
def test_check_calls_says_what_is_wrong(call: ToolCall, expected: str) -> None:
    assert check_calls([call], TOOLS)[0] == expected


def test_check_calls_accepts_what_json_schema_does() -> None:
    fine = [
        ToolCall("bash", {"command": "ls", "timeout": 5.0}),  # an integral number is an integer
        ToolCall("search", {"query": "x", "limit": None, "extra": 1}),  # no additionalProperties: false
        ToolCall("write_file", {"path": "a", "content": ""}),
    ]
    assert check_calls(fine, TOOLS) == ()
    bare = [{"name": "bash", "parameters": {"properties": {"n": {"type": "number"}}}}, {"name": "noop"}]
    assert check_calls([ToolCall("bash", {"n": 3}), ToolCall("noop", {"any": 1})], bare) == ()
    assert check_calls([ToolCall("bash", {})], [])[0].endswith("the tools are: none (no tools were offered).")
    with pytest.raises(ConfigError, match="tool 0 is not a function spec"):
        check_calls([LS], [{"type": "function"}])


# -- the OpenAI form, the registry, detection -------------------------------------------------


def test_openai_form_round_trips() -> None:
    data = WRITE.to_openai() | {"id": "call_7"}
    assert isinstance(data["function"]["arguments"], str)
    assert json.loads(data["function"]["arguments"]) == WRITE.arguments
    assert ToolCall.from_openai(data) == ToolCall(WRITE.name, WRITE.arguments, "call_7")
    assert WRITE.for_template()["function"]["arguments"] == WRITE.arguments  # what templates need
    as_dict = {"function": {"name": "bash", "arguments": {"command": "ls"}}}
    assert ToolCall.from_openai(as_dict) == ToolCall("bash", {"command": "ls"})
    assert (
        ToolCall.from_openai({"id": "c", "type": "function", "function": {"name": "f", "arguments": ""}}).arguments
        == {}
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"name": "bash"}, "needs a 'function' object"),
        ({"function": {"name": 3}}, "non-empty string 'name'"),
        ({"function": {"name": "bash", "arguments": "{bad"}}, "'arguments' is not valid JSON"),
        ({"function": {"name": "bash", "arguments": "[1]"}}, "'arguments' must be a JSON object"),
        ({"type": "code", "function": {"name": "bash"}}, "'type' must be 'function'"),
        ({"id": 7, "function": {"name": "bash"}}, "'id' must be a string"),
    ],
)
def test_from_openai_rejects_bad_shapes(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ToolCall.from_openai(data)


def test_get_parser_names_the_known_ones() -> None:
    assert {name: parser.name for name, parser in PARSERS.items()} == {n: n for n in ("hermes", "glm45", "llama3_json")}
    with pytest.raises(
        ConfigError, match="unknown tool-call parser 'qwen'; the known parsers are: glm45, hermes, llama3_json"
    ):
        get_parser("qwen")


@pytest.mark.parametrize("family", FAMILIES)
def test_detect_parser_on_the_real_templates(family: str) -> None:
    assert detect_parser(template(family)) == spec(family).parser


def test_detect_parser_without_a_tool_format() -> None:
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    assert detect_parser(chatml) is None
    assert detect_parser("<tool_call>\n<function={{ name }}>\n<parameter=x>") is None  # Qwen3-Coder's XML


# -- nothing raises ---------------------------------------------------------------------------

MARKERS = [
    "<tool_call>", "</tool_call>", "<think>", "</think>", "<arg_key>", "</arg_key>", "<arg_value>",
    "</arg_value>", "<|python_tag|>", "{", "}", "[", "]", '"', ";", ":", ",", "\n", "\\n", '"name"',
    '"arguments"', '"parameters"', "bash", "null", "1e999", "-0", "\\u12", "\ud800",
]  # fmt: skip


@settings(database=None, max_examples=150, deadline=None)
@given(
    parser=st.sampled_from(sorted(PARSERS)),
    text=st.lists(st.one_of(st.sampled_from(MARKERS), st.text(max_size=8)), max_size=40).map("".join),
    with_tools=st.booleans(),
)
def test_arbitrary_text_never_raises(parser: str, text: str, with_tools: bool) -> None:
    tools: list[Any] = [*TOOLS, {"bogus": True}, "not even a mapping"] if with_tools else []
    parsed = PARSERS[parser].parse(text, tools=tools)
    assert isinstance(parsed.content, str) and all(isinstance(e, str) for e in parsed.errors)
    assert all(isinstance(c.arguments, dict) for c in parsed.tool_calls)
    json.dumps([c.to_openai() for c in parsed.tool_calls])  # whatever was parsed can be sent on
