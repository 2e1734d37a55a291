"""What the home's paired devices reach besides generation (which the home door mounts
from the wire formats), over the API's floor; it imports no other wing (a contract).

  home_routes.py   pairing, the web chat's page (web/: static files, no build step) and a
                   device's own conversations, whose replies outlive the page
"""
