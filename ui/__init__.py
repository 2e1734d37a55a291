"""The desktop app (PySide6), in wings, one job each, over a floor they share:

- shell/: the window and what frames it — main_window.py (holds the state, gives each
  page its collaborators, wires them), launch.py (the app's start, one instance),
  menus.py, sidebar.py (conversations and the pages' buttons), drawer.py (the pages'
  panel), banner.py (errors and notices), metrics.py (the status bar's figures),
  engine_link.py (the supervised engine: ready, died, restarted), transfer.py (export
  and import dialogs), self_test.py (`homerack self-test --gui`) and screenshots.py
  (`make screenshots`), which drive the whole window as a user would;
- chat/: the conversation — chat_page.py, chat_view.py, composer.py, welcome.py,
  tools_menu.py (the MCP servers a chat may use), approval_card.py (a call asked first);
- models/: the picker and getting models — model_bar.py, model_control.py,
  download_wizard.py, downloads_panel.py, plan_panel.py (the Memory page);
- cluster/: the machines of the home — cluster_page.py, cluster_panel.py;
- home/: the home's phones and laptops — devices_page.py (sharing, pairing codes, the
  paired devices, their limits, who is waiting);
- settings/: settings_page.py, sources_panel.py, tools_panel.py (MCP servers, their logs,
  imports, the decisions kept and revoked);
- documents/: documents_page.py (collections of the user's documents, their progress).

The floor: state.py (the window's state, observed by the pages), tasks.py (work off the
UI thread, one hop back), markdown.py (rendering messages and model cards), safe_text.py
(widgets that show untrusted text inert), theme.py, resources.py (the icon).

The wings know nothing of the shell and nothing of each other (import-linter says so):
the window passes each page the state, a client and callbacks. Nothing here imports the
engine or llama.cpp; the engine is reached over HTTP through app/."""
