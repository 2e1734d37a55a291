"""The desktop app: PySide6 widgets only. Talks to the engine through app.client."""
