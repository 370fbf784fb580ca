"""Tool calls (:mod:`.call`): one parser per model family (:mod:`.parsers`) and checks against the
offered tools (:mod:`.schemas`)."""

from sandrl.inference.toolcalls.call import ToolCall
from sandrl.inference.toolcalls.parsers import (
    PARSERS,
    ParsedReply,
    ToolCallParser,
    detect_parser,
    get_parser,
    split_reasoning,
)
from sandrl.inference.toolcalls.schemas import check_calls

__all__ = [
    "PARSERS",
    "ParsedReply",
    "ToolCall",
    "ToolCallParser",
    "check_calls",
    "detect_parser",
    "get_parser",
    "split_reasoning",
]
