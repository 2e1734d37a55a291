"""The cluster table's rows (ui/cluster/cluster_panel.py: machine_rows): this machine with the
models it holds, the pipeline stages, and the replicas with their models or why they are
left out."""

from ui.cluster.cluster_panel import machine_rows


def test_rows_show_this_machines_models_and_the_replicas():
    view = {"host": "desk", "local_stages": [], "workers": [],
            "models": [{"id": "qwen3-8b", "state": "ready", "running": 2, "queued": 1,
                        "generated_tokens_per_s": 9.5},
                       {"id": "smol", "state": "ready", "running": 0, "queued": 0}],
            "replicas": [{"name": "attic", "state": "serving", "loaded": ["qwen3-8b"],
                          "requests_sent": 4},
                         {"name": "den", "state": "left out", "why": "no answer",
                          "requests_sent": 0}]}
    rows = machine_rows(view)
    assert rows[0][:2] == ("desk (this machine)",
                           "qwen3-8b (2 running, 1 queued, 9.5 tok/s); smol (idle)")
    assert rows[1][0] == "attic (replica)" and rows[1][1] == "qwen3-8b"
    assert rows[1][-1] == "replica, 4 requests sent"
    assert rows[2][0] == "den (replica)" and rows[2][-1] == "replica left out: no answer"
