"""Each model's own sampling defaults: a request that leaves sampling out (OpenAI clients
send none by default, and neither does the app unless the user sets it) is sampled as the
model's authors advise, else conservatively for its size."""


import openai
import pytest

from app.history import DEFAULT_SYSTEM_PROMPT
from app.settings import Sampling
from support.models import PARIS_QUESTION, STARTER


@pytest.fixture(scope="module")
def client(server):
    address, _, _ = server
    return openai.OpenAI(base_url=f"{address.url}/v1", api_key=address.token, max_retries=0)


def test_starter_answers_paris_with_the_apps_defaults_in_nine_of_ten_seeds(client):
    """The app's request as the app sends it (Sampling() leaves temperature and top-p to
    the model); a new random seed each time, as the app does, here ten fixed ones."""
    asked = Sampling().as_request()
    assert "temperature" not in asked and "top_p" not in asked
    answers = []
    for seed in range(10):
        reply = client.chat.completions.create(
            model=STARTER, seed=seed, max_tokens=24,
            extra_body={"response_cache": "off"},
            messages=[{"role": "system", "content": DEFAULT_SYSTEM_PROMPT},
                      {"role": "user", "content": PARIS_QUESTION}])
        answers.append(reply.choices[0].message.content)
    right = [a for a in answers if "Paris" in a]
    assert len(right) >= 9, answers


def test_model_list_says_each_models_defaults_and_where_they_came_from(http):
    models = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    smol = models[STARTER]["sampling_defaults"]
    assert (smol["temperature"], smol["frequency_penalty"]) == (0.0, 0.3)
    assert "default for a 134M model" in smol["source"]
