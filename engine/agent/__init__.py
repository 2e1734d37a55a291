"""What programs need on top of chat: JSON-schema constraints (grammars for llama.cpp's
sampler), tool calls in the formats chat templates use, and one shape for the OpenAI,
Anthropic and Responses conversations. No HTTP here: the API's routes translate."""
