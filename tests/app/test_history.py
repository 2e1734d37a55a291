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


def test_regenerate_and_edit_keep_the_alternatives_navigable(tmp_path):
    history = History(tmp_path / "history.sqlite3")
    chat = history.create()
    question = history.add_message(chat.id, "user", "capital of France?")
    first = history.add_message(chat.id, "assistant", "Paris.")
    history.rewind(chat.id, first.id)  # regenerate: the next answer goes beside it
    history.add_message(chat.id, "assistant", "It is Paris.")
    shown = history.messages(chat.id)
    assert [m.content for m in shown] == ["capital of France?", "It is Paris."]
    assert shown[1].variant == (2, 2)
    history.switch(chat.id, shown[1].id, -1)  # ‹
    assert [m.content for m in history.messages(chat.id)][1] == "Paris."
    history.rewind(chat.id, question.id)  # edit the question and resend
    history.add_message(chat.id, "user", "capital of Italy?")
    history.add_message(chat.id, "assistant", "Rome.")
    edited = history.messages(chat.id)
    assert [m.content for m in edited] == ["capital of Italy?", "Rome."]
    assert edited[0].variant == (2, 2)
    history.switch(chat.id, edited[0].id, 1)  # back to the first question, its last answer
    back = history.messages(chat.id)
    assert [m.content for m in back] == ["capital of France?", "It is Paris."]
    assert back[1].variant == (2, 2)
    history.close()


def test_search_finds_words_in_any_message_and_titles(tmp_path):
    history = History(tmp_path / "history.sqlite3")
    a, b = history.create("Cooking"), history.create("Travel")
    history.add_message(a.id, "user", "How long do I boil spaghetti?")
    history.add_message(b.id, "user", "Trains from Lyon to Paris")
    assert [c.title for c in history.conversations("spagh")] == ["Cooking"]
    assert [c.title for c in history.conversations("lyon paris")] == ["Travel"]
    assert [c.title for c in history.conversations("trav")] == ["Travel"]
    assert history.conversations('"; DROP TABLE messages; --') == []
    assert len(history.conversations("")) == 2
    history.close()


def test_a_deleted_conversation_comes_back_with_undo_until_the_next_start(tmp_path):
    path = tmp_path / "history.sqlite3"
    history = History(path)
    chat = history.create("Keep me")
    history.add_message(chat.id, "user", "hello")
    history.delete(chat.id)
    assert history.conversations() == []
    history.restore(chat.id)
    assert [c.title for c in history.conversations()] == ["Keep me"]
    history.delete(chat.id)
    history.close()
    reopened = History(path)
    assert reopened.conversations() == [] and reopened.conversations("hello") == []
    reopened.close()


def test_a_reasoning_reply_keeps_its_thinking_apart_and_never_sends_it_back(tmp_path):
    from app.session import Sessions
    from app.transcripts import import_json, to_json, to_markdown

    history = History(tmp_path / "history.sqlite3")
    chat = history.create(system_prompt="")
    history.add_message(chat.id, "user", "Is 1001 prime?")
    sessions = Sessions(history)
    sessions.start(chat.id)
    sessions.feed(chat.id, "7 × 143 = 1001.", "reasoning")
    sessions.feed(chat.id, "No: 7 × 11 × 13.")
    saved = sessions.finish(chat.id, "complete", "qwen3", thought_s=12.4)
    assert (saved.content, saved.reasoning, saved.thought_s) == (
        "No: 7 × 11 × 13.", "7 × 143 = 1001.", 12.4)
    assert history.messages(chat.id)[-1].reasoning == "7 × 143 = 1001."
    assert sessions.request(history.get(chat.id)) == [
        {"role": "user", "content": "Is 1001 prime?"},
        {"role": "assistant", "content": "No: 7 × 11 × 13."}]  # the thinking stays here
    assert "<summary>Thinking</summary>" in to_markdown(history, [history.get(chat.id)])
    other = History(tmp_path / "other.sqlite3")
    (copied,) = import_json(other, to_json(history, [history.get(chat.id)]))
    assert other.messages(copied.id)[-1].reasoning == "7 × 143 = 1001."
