"""Thinking on or off in the chat template (``mlxd --reasoning on|off|auto``, a request's ``chat_template_kwargs``).

Contract:
- ``template_variables(mode, requested)``: the extra variables the chat template is rendered with:
  ``enable_thinking`` (the variable Qwen3-style templates read; mlx-lm renames it for models whose template
  reads another) false for "off", true for "on" and "auto" (llama-server's meaning of auto: thinking
  wherever the template has it; "on" renders the same). A request's ``chat_template_kwargs`` override it.
- ``close_open_thinking(prompt, template)``: with thinking off, a prompt the template left inside a thinking
  block gets the block closed, as llama-server does: a prompt that ends with an opening tag (DeepSeek-R1's
  and QwQ's generation prompts open ``<think>`` themselves) gets the closing tag; a template that knows a
  thinking block (both tags appear in it) and whose prompt does not end with the closing tag gets an empty
  block (``<|START_THINKING|><|END_THINKING|>`` for Command R7B). Anything else is returned unchanged.
- ``thinking_off(variables)``: whether the variables turn thinking off.
- ``today_variables(template)``: today's date under the names templates read when the server gives it
  (as llama-server does): ``date_string`` ("03 Dec 2026", Llama 3.x) and ``datetime`` ("Dec 03 2026",
  FireFunction), each only where ``template`` names it; a request's ``chat_template_kwargs`` override them.
  (``strftime_now`` is the renderer's own.)
- ``tool_list_variables(template, tools)``: ``functions``, the offered tools as JSON text (indented by 2; ""
  when none), for templates that read that variable instead of ``tools`` (FireFunction v2, as llama-server's
  chat handler for it gives it); empty for any other template. A request's ``chat_template_kwargs`` override it.
"""

from __future__ import annotations

import datetime
import functools
import json

import jinja2
import jinja2.meta

# (opening, closing) tags of the thinking blocks chat templates use
THINKING_TAGS = (("<think>", "</think>"), ("<|START_THINKING|>", "<|END_THINKING|>"), ("<seed:think>", "</seed:think>"))


def template_variables(mode: str, requested: dict | None) -> dict:
    """The chat template's extra variables for the daemon's ``mode`` and a request's own ``requested`` ones."""
    variables = {"enable_thinking": mode != "off"}
    variables.update(requested or {})
    return variables


def thinking_off(variables: dict) -> bool:
    return variables.get("enable_thinking", True) is False


def close_open_thinking(prompt: str, template: str | None) -> str:
    """``prompt`` with a thinking block closed or an empty one added, where thinking is off (see above)."""
    tail = prompt.rstrip()
    for opening, closing in THINKING_TAGS:
        if tail.endswith(opening):
            return prompt + closing
    for opening, closing in THINKING_TAGS:
        if template and opening in template and closing in template:
            return prompt if tail.endswith(closing) else prompt + opening + closing
    return prompt


TODAY_FORMATS = {"date_string": "%d %b %Y", "datetime": "%b %d %Y"}


def today_variables(template: str | None) -> dict:
    today = datetime.date.today()
    return {name: today.strftime(form) for name, form in TODAY_FORMATS.items() if template and name in template}


@functools.lru_cache(maxsize=8)
def _template_reads(template: str) -> frozenset[str]:
    """The variables ``template`` reads without setting them (none when it does not parse)."""
    try:
        return frozenset(
            jinja2.meta.find_undeclared_variables(
                jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
            )
        )
    except jinja2.TemplateError:
        return frozenset()


def tool_list_variables(template: str | None, tools: list[dict] | None) -> dict:
    if not template or "functions" not in template or "functions" not in _template_reads(template):
        return {}
    return {"functions": json.dumps(tools, indent=2, ensure_ascii=False) if tools else ""}
