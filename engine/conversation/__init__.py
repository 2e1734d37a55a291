"""The conversation a request carries, in one shape whatever API it came through, and
what programs need on top of chat (tools, forced calls, schemas, pictures), with no HTTP
and no llama.cpp (the API's routes translate; llama/grammar.py turns branches into a
grammar):

  conversation.py  one shape for the OpenAI, Anthropic and Responses conversations
  tool_formats.py  tools given to a model in its family's form, and the forced call
  compose.py       a conversation made ready: messages, tools, branches, how it is read
  json_schema.py   JSON Schema checked (whole or refused) and the branches of a grammar
  images.py        images a request carries, checked and decoded to pixels by Pillow
"""
