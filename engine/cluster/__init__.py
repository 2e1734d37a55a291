"""The LAN cluster: other machines of the home as pipeline stages, over llama.cpp's RPC
backend. The raw RPC protocol never faces the network: each worker's LAN port is a TLS
gateway that admits paired hosts only (gateway.py), and the host reaches it through local
forwarders that llama.cpp connects to (link.py). Placement is a pure function
(placement.py); discovery is mDNS (discovery.py)."""
