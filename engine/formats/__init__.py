"""How each model family writes its answer: where its reasoning sits, how it calls
tools, which of its control tokens end its turn; read from the chat template.

Pure text in, text out: nothing here drives llama.cpp. `families.detect` names a chat
template's family, `Family.parse` reads a whole or partial answer into content, reasoning
and tool calls, and `stream.FormatStream` turns successive parses into the deltas the
APIs send (`Text`, `Reasoning`, `CallStart`, `CallArgs`)."""
