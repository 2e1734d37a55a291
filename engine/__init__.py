"""Homerack's inference engine. Knows nothing of Qt. Rooms, each with its own map:
api/, batching/, catalog/, cluster/, conversation/, documents/, formats/, home/, hub/, llama/,
machine/, model/, speculation/, tools/, voice/; and on the floor beside them:

  engine.py          the front door the API calls: submit, load, models, status
  intake.py          what a request asked, with its conversation, as the request submit takes
  router.py          the routing pair held for model "auto": set, planned, each request routed
  fleet.py           the models one engine holds at once, a lane each, as a difference
  cascade.py         routed requests the small model answers first, escalated if unsure
  routing.py         the small/large pair behind model "auto", and its rules
  response_cache.py  whole answers to deterministic requests, replayed
  events.py          requests, jobs and the events a job emits
  errors.py          one error hierarchy, each with its HTTP status
  settings.py        what the engine is started with (frozen values, at the bottom)
  presets.py         the user's choices per model, kept in a file
  sampling_limits.py the bounds of the sampling fields, written once
  status.py          the engine's figures as /health answers them
  metrics.py         the status as Prometheus metrics
  files.py           small files written whole, read back checked
  outbound.py        connections to addresses a request names: public ones only, pinned
  prefix.py          how many leading tokens two token lists share (batching, caches, drafts)
  kept.py            caches of what requests bring, bounded in bytes (schemas, turns, templates)
  spawn.py           starting one of this installation's modules as a child
"""
