"""Sharing with the home: devices_page.py (the switch, the address and its QR code, adding
a device by code, the paired devices, their limits and who is waiting)."""
