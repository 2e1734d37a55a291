"""The app's conversation history (app/history.py): which model answered each message
and how, and routing per conversation — also in a database written before they existed."""

import sqlite3

from app.history import History


def test_a_reply_keeps_its_model_and_how_it_came(tmp_path):
    history = History(tmp_path / "history.sqlite3")
    chat = history.create(model="small")
    history.update(chat.id, routed=True)
    history.add_message(chat.id, "user", "hi")
    history.add_message(chat.id, "assistant", "hello", "complete", "small",
                        "auto (rules): a short question")
    assert history.get(chat.id).routed
    user, reply = history.messages(chat.id)
    assert user.model is None and user.detail == ""
    assert (reply.model, reply.detail) == ("small", "auto (rules): a short question")
    history.close()


def test_a_database_from_before_gains_the_columns_and_keeps_its_rows(tmp_path):
    path = tmp_path / "history.sqlite3"
    with sqlite3.connect(path) as db:  # the first release's schema
        db.executescript("""
            CREATE TABLE conversations (id INTEGER PRIMARY KEY, title TEXT NOT NULL,
                system_prompt TEXT NOT NULL DEFAULT '', model TEXT, updated REAL NOT NULL);
            CREATE TABLE messages (id INTEGER PRIMARY KEY AUTOINCREMENT,
                conversation_id INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
                status TEXT NOT NULL DEFAULT 'complete');
            INSERT INTO conversations VALUES (1, 'old chat', '', 'm', 0);
            INSERT INTO messages (conversation_id, role, content) VALUES (1, 'user', 'hi');
        """)
    history = History(path)
    old = history.get(1)
    assert old.title == "old chat" and not old.routed
    (message,) = history.messages(1)
    assert message.content == "hi" and message.model is None
    history.add_message(1, "assistant", "yo", model="m", detail="from the response cache")
    assert history.messages(1)[-1].detail == "from the response cache"
    history.close()
    History(path).close()  # opening it again adds nothing twice
