"""The window and its frame: the main window (main_window.py), its start (launch.py),
menus (menus.py), the sidebar (sidebar.py), the drawer of pages (drawer.py), the banner
(banner.py), the status bar's figures (metrics.py), the link to the supervised engine
(engine_link.py), export and import (transfer.py), and the two drivers of the whole
window: the GUI self-test (self_test.py) and the screenshots (screenshots.py)."""
