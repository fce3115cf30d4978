"""A copy of the embedded model whose chat template offers tools in the Qwen-style JSON format.

SmolLM2-135M-Instruct's template has no tools (mlx-lm gives it no tool parser), so the tool-call tests run
on the embedded tiny model with this template: it names ``<tool_call>`` and ``tool_call.name``, from which
mlx-lm infers its ``json_tools`` parser, as it does for Qwen 2.5 / 3 checkpoints.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

EMBEDDED = Path(__file__).resolve().parents[2] / "models" / "mlxd-qwen3-tiny"

TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call these tools:\n{% for tool in tools %}{{ tool | tojson }}\n"
    '{% endfor %}Call one as <tool_call>\n{"name": <name>, "arguments": <arguments>}\n</tool_call><|im_end|>\n'
    "{% endif %}{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "{% if message.tool_calls %}{% for tool_call in message.tool_calls %}{% set tool_call = tool_call.function %}"
    '<tool_call>\n{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["city", "unit"],
            "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "additionalProperties": False,
            "required": ["zone"],
            "properties": {"zone": {"type": "string", "maxLength": 10}},
        },
    },
}


def make_tool_model(directory: Path) -> Path:
    """Copy the embedded model into ``directory`` with the tool template; returns the directory."""
    for source in EMBEDDED.iterdir():
        if source.is_file():
            shutil.copy(source, directory / source.name)
            (directory / source.name).chmod(0o644)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["chat_template"] = TOOL_TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory
