"""The household: the phones and laptops the owner pairs with this engine, and what
each may use of it.

`devices.py`: the paired devices (each key stored hashed, in a private file), the one-use
pairing codes the desktop shows, and the lock against guessing them. `meter.py`: what
each device has in flight, its tokens in the last minute and today, and the limits that
turn a request away with a 429. `conversations.py`: each device's conversations of the
web chat, kept in a private SQLite file. `household.py`: all of that as the engine holds
it, with the owner's choices (default limits, the owner's precedence, the models shared).
Nothing here knows HTTP or llama.cpp: the
sharing listener (`api/home/home_routes.py`) and the lanes' fair turns (`batching/fairness.py`)
read it through the engine.
"""
