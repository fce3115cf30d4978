"""The value rules several requests share: the prompt, chat messages, ``chat_template_kwargs``, tool names, token ids.

Contract: each check raises ``FieldError`` naming the field; ``messages`` calls them from the requests'
``validate()``, and the HTTP gateway checks bodies with ``check_prompt`` and ``check_template_kwargs`` (both
re-exported by ``messages``; mlx-generate asks ``check_prompt`` of its argument too).
"""

from typing import Any

from .field_checks import FieldError


def require(condition: bool, message: str) -> None:
    if not condition:
        raise FieldError(message)


def check_tokens(tokens: list[int] | None, where: str) -> None:
    if tokens:
        require(min(tokens) >= 0, f"{where}: token ids must be >= 0")


def check_prompt(prompt: str | list[int], where: str) -> None:
    """The prompt's one check at the protocol's edge: text that is not empty, or token ids, at least one and
    each >= 0. ``Generate.validate`` asks it of ``prompt`` and ``prompt_tokens``; the HTTP gateway of a body's
    prompt and mlx-generate of its argument, so each refuses with the same rule (``where`` names the field).

    Raises:
        FieldError: the prompt is empty, or a token id is negative.
    """
    if isinstance(prompt, str):
        require(len(prompt) > 0, f"{where}: must not be empty")
        return
    require(len(prompt) > 0, f"{where}: must hold at least one token")
    check_tokens(prompt, where)


def check_chat_messages(messages: list[dict] | None, where: str) -> None:
    if messages is None:
        return
    require(len(messages) > 0, f"{where}: must hold at least one message")
    for index, message in enumerate(messages):
        for key in ("role", "content"):
            require(type(message.get(key)) is str, f"{where}[{index}].{key}: expected str")


MAX_TEMPLATE_KWARGS = 32  # chat_template_kwargs: names per request


def check_optional_template_kwargs(kwargs: dict | None, messages: list[dict] | None) -> None:
    if kwargs is None:
        return
    require(messages is not None, "chat_template_kwargs: with messages only")
    check_template_kwargs(kwargs)


def check_template_kwargs(kwargs: dict) -> None:
    """The names ``chat_template_kwargs`` may hold (the HTTP gateway checks bodies with it too).

    Raises:
        FieldError: more than ``MAX_TEMPLATE_KWARGS`` names, a name that is not an identifier, or one the
            request's own fields set (``RENDER_ARGUMENTS``).
    """
    require(len(kwargs) <= MAX_TEMPLATE_KWARGS, f"chat_template_kwargs: at most {MAX_TEMPLATE_KWARGS} names")
    require(all(name.isidentifier() for name in kwargs), "chat_template_kwargs: names must be identifiers")
    require(
        not set(kwargs) & RENDER_ARGUMENTS,
        f"chat_template_kwargs: {sorted(set(kwargs) & RENDER_ARGUMENTS)} are set by the request itself",
    )


# what the renderer is given from the request's own fields, never from chat_template_kwargs
RENDER_ARGUMENTS = frozenset(
    {
        "messages",
        "conversation",
        "tools",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "return_dict",
        "chat_template",
        "documents",
        "padding",
        "truncation",
    }
)


def tool_name(tool: Any) -> str | None:
    """The function name of an OpenAI-style tool definition, None when it has none."""
    function = tool.get("function") if isinstance(tool, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    return name if isinstance(name, str) and name else None


def exactly_one(message: Any, names: tuple[str, ...]) -> None:
    given = [name for name in names if getattr(message, name) is not None]
    require(
        len(given) == 1, f"exactly one of {', '.join(names)} must be given; got {', '.join(given) if given else 'none'}"
    )
