"""The household's machines: other machines as pipeline stages over llama.cpp's RPC
backend, and paired machines serving whole models as replicas. The raw RPC protocol
never faces the network: each worker's LAN port is a TLS gateway that admits paired
machines only.

  head.py        the head's view of its workers: links, devices, placement (stages)
  placement.py   where each layer runs, a pure function (stages)
  worker.py      this machine shared: llama.cpp's RPC server, supervised (stages)
  gateway.py     the worker's LAN port: TLS, a hello line, then RPC bytes
  link.py        the head's side of a worker: pairing, heartbeat, local forwarder
  relay.py       byte relays between two connections
  protocol.py    what head and gateway say before the RPC bytes flow
  pairing.py     what pairing leaves behind, in private files
  identity.py    a machine's TLS certificate and the fingerprint pairing pins
  discovery.py   workers announced and found with mDNS
  replicas.py    paired machines serving whole models, and choosing one per request
"""
