"""Chat templates a daemon may use instead of its model's (``mlxd --chat-template``).

Contract: ``resolve_chat_template(value)`` turns ``--chat-template``'s value into Jinja text: one of the
built-in names below (the formats llama-server knows by these names, written here as Jinja for the
transformers renderer), else the value itself, taken as a Jinja template. ``install_chat_template``
makes a loaded tokenizer render with that text. Each built-in template starts with ``bos_token``, as
llama.cpp puts the model's BOS before any template's output, and ends with the assistant's header when
``add_generation_prompt`` is set.
"""

from __future__ import annotations

from typing import Any

BUILT_IN_TEMPLATES = {
    "chatml": (
        "{{ bos_token }}{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "llama2": (
        "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'system' %}[INST] <<SYS>>\n"
        "{{ message['content'] }}\n<</SYS>>\n\n{% elif message['role'] == 'user' %}"
        "{% if loop.index0 == 0 or messages[loop.index0 - 1]['role'] != 'system' %}[INST] {% endif %}"
        "{{ message['content'] }} [/INST]{% else %}{{ message['content'] }}</s>{% endif %}{% endfor %}"
    ),
    "llama3": (
        "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
        "{{ message['content'] }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    "command-r": (
        "{{ bos_token }}{% for message in messages %}<|START_OF_TURN_TOKEN|>"
        "{% if message['role'] == 'system' %}<|SYSTEM_TOKEN|>{% elif message['role'] == 'user' %}<|USER_TOKEN|>"
        "{% else %}<|CHATBOT_TOKEN|>{% endif %}{{ message['content'] }}<|END_OF_TURN_TOKEN|>{% endfor %}"
        "{% if add_generation_prompt %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>{% endif %}"
    ),
}


def resolve_chat_template(value: str) -> str:
    """The Jinja text for ``--chat-template VALUE``: a built-in template's, else ``value`` itself.

    Args:
        value: A name of ``BUILT_IN_TEMPLATES`` or Jinja text.

    Returns:
        Jinja text for the transformers chat-template renderer.
    """
    return BUILT_IN_TEMPLATES.get(value.strip().lower(), value)


def install_chat_template(tokenizer: Any, template: str) -> None:
    """Make an mlx-lm ``TokenizerWrapper`` render chats with ``template`` instead of the model's.

    Args:
        tokenizer: The wrapper of a loaded model (its Hugging Face tokenizer is ``_tokenizer``).
        template: Jinja text.
    """
    tokenizer._tokenizer.chat_template = template
    tokenizer._chat_template = None  # a custom Python renderer of the model would take precedence
    tokenizer.has_chat_template = True
