"""The models: the picker bar (model_bar.py), what the window knows of the engine's
models and loading them (model_control.py), the download wizard (download_wizard.py),
the Downloads page (downloads_panel.py) and the Memory page's plan (plan_panel.py)."""
