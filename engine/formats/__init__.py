"""How each model family writes its answer: where its reasoning sits, how it calls
tools, which of its control tokens end its turn; read from the chat template. Pure text
in, text out: nothing here drives llama.cpp.

  families.py     the families, told from their templates (`detect`), and `Family.parse`
  tool_syntax.py  the ways models write tool calls: JSON, named, XML-like, Python-like
  harmony.py      OpenAI's harmony format (gpt-oss)
  scan.py         small scanners the families share (JSON ends, held-back tails)
  stream.py       successive parses turned into the deltas the APIs send
  parsed.py       what an answer holds once read: Text, Reasoning, CallStart, CallArgs
"""
