"""Messages to the chat view's HTML (ui/markdown.py): Markdown rendered, code highlighted
with a copy link, each message's actions, and model output never rendered as HTML."""

from ui.markdown import Shown, render
from ui.theme import DARK, LIGHT


def test_markdown_tables_code_and_actions():
    answer = ("# Title\n\n- one\n- two\n\n> quoted\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n"
              "[docs](https://example.org)\n\n```python\nprint('hi')\n```")
    out = render([Shown("7", "user", "question"),
                  Shown("8", "assistant", answer, meta="smol · from the response cache",
                        stats="12 tokens · 40.0 tokens/s", variant=(2, 3), last=True)], LIGHT)
    html = out.html
    for part in ("<h1>Title</h1>", "<li>one</li>", "<blockquote>", '<table border="1"',
                 '<a href="https://example.org">docs</a>', 'href="copycode:0"',
                 'href="edit:7"', 'href="regen:8"', 'href="prev:8"', "2/3", 'href="stats:8"'):
        assert part in html, part
    assert 'style="color: #007020"' in html  # pygments' "friendly" colours for print
    assert out.codes == ["print('hi')\n"] and out.stats["8"] == "12 tokens · 40.0 tokens/s"
    assert 'href="edit:8"' not in html and 'href="regen:7"' not in html
    assert render([Shown("8", "assistant", answer)], DARK).html != render(
        [Shown("8", "assistant", answer)], LIGHT).html


def test_model_output_is_text_not_markup():
    html = render([Shown("1", "assistant", "<script>alert(1)</script> <b>bold</b> "
                                           "[x](javascript:alert(1))")], LIGHT).html
    assert "<script>" not in html and "&lt;script&gt;" in html and "<b>bold</b>" not in html
    assert 'href="javascript' not in html  # markdown-it refuses the link


def test_an_unclosed_fence_while_streaming_is_still_code_with_one_copy_link():
    out = render([Shown("s", "assistant", "Here:\n```js\nconst a = 1")], LIGHT)
    assert out.codes == ["const a = 1"] and out.html.count("copycode:") == 1


def test_thinking_is_a_section_closed_once_answered_open_while_thinking_and_inert():
    thought = Shown("7", "assistant", "No.", reasoning="<img src='/dev/zero'> 7 × 143",
                    thought_s=12.4)
    closed = render([thought], LIGHT).html
    assert 'href="think:7"' in closed and "Thought for 12 s" in closed and "143" not in closed
    opened = render([thought], LIGHT, frozenset({"7"})).html
    assert "7 × 143" in opened and "<img" not in opened and "&lt;img" in opened
    live = render([Shown("s", "assistant", "", reasoning="hm", thinking=True)], LIGHT).html
    assert "Thinking…" in live and "hm" in live
