"""Where a model's sampling defaults come from: its file, its generation_config.json, its
size; and the app's saved settings from before they existed."""

import json

import pytest

from app.settings import Sampling, load_sampling, save_settings
from engine.catalog.gguf_file import GGUFInfo
from engine.catalog.sampling_defaults import model_defaults, sidecar_of


def info(path, size_bytes=4 << 30, sampling=None) -> GGUFInfo:
    return GGUFInfo(str(path), size_bytes, "llama", "m", 32, 8192, None, None, None, False,
                    100, "gpt2", 1000, "h", sampling=sampling)


def test_the_files_keys_come_first_and_fill_the_rest_by_size(tmp_path):
    model = tmp_path / "m.gguf"
    sidecar_of(model).write_text('{"temperature": 1.5}')
    chosen = model_defaults(info(model, sampling={"temp": 0.6, "top_k": 20}))
    assert (chosen.temperature, chosen.top_k, chosen.top_p) == (0.6, 20, 0.9)
    assert chosen.source == "the model file's general.sampling keys"


def test_generation_config_beside_the_file_is_next(tmp_path):
    model = tmp_path / "Qwen3-8B-Q4_K_M.gguf"
    assert sidecar_of(model).name == "Qwen3-8B-Q4_K_M.generation_config.json"
    sidecar_of(model).write_text(json.dumps({"temperature": 0.6, "top_p": 0.95, "top_k": 20,
                                             "min_p": 0.0, "bos_token_id": 1}))
    chosen = model_defaults(info(model))
    assert (chosen.temperature, chosen.top_p, chosen.top_k, chosen.min_p) == (0.6, 0.95, 20, 0.0)
    sidecar_of(model).write_text('{"do_sample": false, "temperature": 0.9}')
    assert model_defaults(info(model)).temperature == 0.0  # the authors decode greedily
    tiny = model_defaults(info(model, size_bytes=100 << 20))
    assert tiny.frequency_penalty == 0.0  # the size rule's penalty goes with its greedy


@pytest.mark.parametrize("config", ['{"temperature": 9, "top_p": -1, "top_k": true}',
                                    "not json", "[1, 2]"])
def test_insane_or_broken_configs_fall_back_to_the_size_default(tmp_path, config):
    model = tmp_path / "m.gguf"
    sidecar_of(model).write_text(config)
    chosen = model_defaults(info(model, size_bytes=5 << 30))
    assert (chosen.temperature, chosen.top_p) == (0.7, 0.9)
    assert chosen.source.startswith("Homerack's default for a 10.7B model")


@pytest.mark.parametrize("size, temperature", [(100 << 20, 0.0), (600 << 20, 0.2),
                                               (1 << 30, 0.5), (8 << 30, 0.7)])
def test_smaller_models_are_sampled_cooler(tmp_path, size, temperature):
    assert model_defaults(info(tmp_path / "m.gguf", size_bytes=size)).temperature == temperature


def test_old_app_settings_drop_the_fixed_temperature_but_keep_the_rest(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"temperature": 0.7, "top_p": 0.95, "max_tokens": 300}))
    old = load_sampling(path)
    assert (old.temperature, old.top_p, old.max_tokens) == (None, None, 300)
    save_settings(path, Sampling(temperature=1.1, max_tokens=300))
    assert load_sampling(path).temperature == 1.1  # chosen since: kept
    assert Sampling(temperature=1.1).as_request()["temperature"] == 1.1
