"""The API's wire formats: each app's way of asking for generation, a module each, over
the floor they share (turns.py, schemas.py, wire.py, thinking.py, grounding.py); none
imports another wing (a contract).

  openai_routes.py      OpenAI's chat completions and completions
  anthropic_routes.py   Anthropic's Messages
  responses_routes.py   OpenAI's Responses; mcp_responses.py: its `mcp` tool (servers
                        listed, calls run or approval asked, rounds until the answer)
  embeddings_routes.py  OpenAI's embeddings, and llama-server's rerank
  audio_routes.py       OpenAI's audio: transcriptions, translations, speech (engine/voice)
  ollama_routes.py      Ollama's API (tags, show, ps, chat, generate, embed), for the apps
                        that speak it; ollama_schemas.py: its request bodies
"""
