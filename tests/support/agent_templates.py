"""Chat templates in each tool-call family, written for these tests after the way the
real ones (Qwen 2.5 / Hermes, Llama 3.1, Mistral) give tools to the model and show past
calls and results."""

from fixtures.agent_model import HERMES  # the agent model's own

LLAMA3 = (
    "{{ bos_token }}{%- if tools %}<|start_header_id|>system<|end_header_id|>\n\nEnvironment: "
    "ipython\nRespond with a JSON {\"name\": function name, \"parameters\": arguments}.\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}<|eot_id|>{% endif %}"
    "{%- for message in messages %}"
    "{%- if message.tool_calls %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{\"name\": \"{{ message.tool_calls[0].function.name }}\", \"parameters\": "
    "{{ message.tool_calls[0].function.arguments | tojson }}}<|eot_id|>"
    "{% elif message.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n"
    "{{ message.content }}<|eot_id|>"
    "{% else %}<|start_header_id|>{{ message.role }}<|end_header_id|>\n\n{{ message.content }}"
    "<|eot_id|>{% endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

MISTRAL = (
    "{{ bos_token }}{%- for message in messages %}"
    "{%- if message.role == 'user' %}{% if loop.last and tools %}[AVAILABLE_TOOLS]"
    "{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ message.content }}[/INST]"
    "{% elif message.tool_calls %}[TOOL_CALLS]{{ message.tool_calls | map(attribute='function') "
    "| list | tojson }}{{ eos_token }}"
    "{% elif message.role == 'tool' %}[TOOL_RESULTS]{\"content\": {{ message.content | tojson }}, "
    "\"call_id\": \"{{ message.tool_call_id }}\"}[/TOOL_RESULTS]"
    "{% elif message.role == 'assistant' %}{{ message.content }}{{ eos_token }}"
    "{% else %}{{ message.content }}\n\n{% endif %}{%- endfor %}"
)
