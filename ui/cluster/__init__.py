"""The Cluster page (cluster_page.py): sharing this machine and pairing others, with the
machines, stages and replicas as rows (cluster_panel.py)."""
