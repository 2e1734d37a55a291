"""The owner's routes about the engine itself, over the API's floor; none imports another
wing (a contract).

  admin_routes.py       models, loading, plans, presets, routing, sources, health, metrics
  hub_routes.py         the Hub: search, quants and verdicts, cards, downloads
  tool_routes.py        MCP: the servers, their tools and policies, an approved call, the
                        user's decisions, the log of calls
  document_routes.py    document collections: added, listed with progress, searched
  home_admin_routes.py  the home: sharing on or off, codes, devices, limits, who waits
"""
