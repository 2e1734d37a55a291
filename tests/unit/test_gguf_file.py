import pytest

from engine.errors import InvalidModelFile
from engine.catalog.gguf_file import GGUFInspector


def test_reads_metadata_of_a_valid_file(tiny_model):
    info = GGUFInspector().inspect(tiny_model)
    assert info.architecture == "llama"
    assert info.block_count == 2 and info.context_length == 512
    assert info.bos_token == "<s>" and info.add_bos_token
    assert "<|im_start|>" in info.chat_template


def test_not_gguf_is_refused(tmp_path):
    bogus = tmp_path / "notes.gguf"
    bogus.write_text("just some text, not a model")
    with pytest.raises(InvalidModelFile, match="not a GGUF"):
        GGUFInspector().inspect(bogus)


@pytest.mark.parametrize("fraction", [0.5, 0.99, 0.01])
def test_truncated_file_is_refused(tmp_path, tiny_model, fraction):
    data = tiny_model.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(len(data) * fraction)])
    with pytest.raises(InvalidModelFile, match="truncated|damaged"):
        GGUFInspector().inspect(cut)


def test_results_are_cached_on_disk_and_invalidated_by_changes(tmp_path, tiny_model):
    cache = tmp_path / "cache.json"
    model = tmp_path / "m.gguf"
    model.write_bytes(tiny_model.read_bytes())
    GGUFInspector(cache).inspect(model)
    assert cache.exists()
    assert GGUFInspector(cache).inspect(model).name == "tiny-random"  # served from disk
    model.write_bytes(model.read_bytes()[:1000])  # the file changes: it is read again
    with pytest.raises(InvalidModelFile):
        GGUFInspector(cache).inspect(model)
