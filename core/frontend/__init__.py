"""Text in and out of the engine: tokenizer, chat format, streaming detokenizer, reasoning split,
tool-call parser, stop strings.

Prompt side:  ChatFormat.render(messages, tools=...) -> str -> Tokenizer.encode -> ids
Output side:  ids -> StreamDecoder -> text deltas -> ReasoningSplitter -> (reasoning, content)
              content -> StopMatcher (engine) -> ToolCallStream / parse_tool_calls (server)
"""

from ninfer.frontend.chat import ChatFormat, normalize_conversation, render_chat
from ninfer.frontend.detokenize import StreamDecoder
from ninfer.frontend.reasoning import ReasoningSplitter, split_reasoning
from ninfer.frontend.stops import StopMatcher
from ninfer.frontend.tokenizer import Tokenizer, load_tokenizer
from ninfer.frontend.toolcalls import ToolCall, ToolCallStream, parse_tool_calls

__all__ = [
    "ChatFormat",
    "ReasoningSplitter",
    "StopMatcher",
    "StreamDecoder",
    "Tokenizer",
    "ToolCall",
    "ToolCallStream",
    "load_tokenizer",
    "normalize_conversation",
    "parse_tool_calls",
    "render_chat",
    "split_reasoning",
]
