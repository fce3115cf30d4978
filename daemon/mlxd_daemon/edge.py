"""The daemon's edge: wire Generate → scheduler Request (tokenizing here), scheduler events → wire replies.

Contract: everything textual happens here, never in the scheduler or the engine: applying the chat
template, encoding the prompt, building the request's TextStream (streaming detokenizer + stop
strings) and compiling a request's constraint (a JSON schema or grammar; one the library rejects is an
invalid_request Error with its message), and a request's tools (through the chat template; "required" or
a named function as a grammar; the calls split out of the text by ``tool_calls.py``). Sampler settings: a
request's ``sampling``, or the daemon's defaults (both a wire ``Sampling``) become the engine's ``SamplingParams`` in
one conversion; their value rules are checked once, by the scheduler's submit (``sampling_rules``, with the model's
vocabulary). Replies: a TokenEvent becomes a Chunk for a streaming request (nothing for a non-streaming one); a
FinishEvent becomes Done with the whole text and tokens, or Error when the request failed. A scheduler ``TickRecord``
becomes the wire's ``Tick`` (``tick_message``).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from mlxd_engine import GrammarError, GrammarLimits, LoadedModel, SamplingParams, compile_grammar
from mlxd_protocol import (
    INTERNAL,
    INVALID,
    Chunk,
    Constraint,
    Done,
    Error,
    Generate,
    ProtocolError,
    Sampling,
    Tick,
    TickRow,
)
from mlxd_protocol.sampling_rules import token_outside_vocabulary
from mlxd_scheduler import FinishEvent, Request, SpeculativeRequest, TextStream, TickRecord, TokenEvent

from .reasoning import close_open_thinking, template_variables, thinking_off, today_variables, tool_list_variables
from .tool_calls import ToolCallSplitter, required_call_grammar, tool_support_problem

_EXCEPTION_PREFIX = re.compile(r"([A-Z]\w*(?:Error|Exception|Full|Exhausted)): ")
MAX_CHARS_PER_TOKEN = 32  # no tokenizer packs more characters than this into one token on real text


def prompt_tokens(loaded: LoadedModel, message: Generate, reasoning: str = "auto") -> list[int]:
    """Token ids of a Generate's prompt (text, token ids, or chat messages; ``reasoning``: the daemon's
    ``--reasoning`` mode for the chat template). The prompt's own check (not empty, token ids >= 0) is the
    protocol's, made when the frame was decoded (``Generate.validate``); here what needs the model: the
    context, the vocabulary, the chat template."""
    tokenizer = loaded.tokenizer
    text_chars = len(message.prompt or "") + sum(len(str(m.get("content", ""))) for m in message.messages or [])
    if text_chars > MAX_CHARS_PER_TOKEN * loaded.context_length:
        # refuse before tokenizing: a huge prompt would hold the daemon's loop while it is encoded
        raise ProtocolError(
            INVALID,
            f"the prompt ({text_chars} characters) cannot fit the model's context of {loaded.context_length} tokens",
        )
    if message.prompt_tokens is not None:
        bad = token_outside_vocabulary(message.prompt_tokens, loaded.vocab_size)
        if bad is not None:
            raise ProtocolError(INVALID, f"prompt_tokens: token {bad} is outside the vocabulary of {loaded.vocab_size}")
        return list(message.prompt_tokens)
    messages = message.messages
    use_chat = message.chat if message.chat is not None else (messages is not None or tokenizer.has_chat_template)
    if messages is None and use_chat:
        messages = [{"role": "user", "content": message.prompt}]
    if use_chat and messages is not None:
        if not tokenizer.has_chat_template:
            raise ProtocolError(INVALID, "this model has no chat template: send a plain prompt with chat=false")
        if message.system:
            messages = [{"role": "system", "content": message.system}, *messages]
        if message.continue_final_message and messages[-1].get("role") != "assistant":
            raise ProtocolError(INVALID, "continue_final_message: the last message must be the assistant's")
        return chat_tokens(
            tokenizer,
            messages,
            offered_tools(message),
            message.continue_final_message,
            template_variables(reasoning, message.chat_template_kwargs),
        )
    if message.continue_final_message:
        raise ProtocolError(INVALID, "continue_final_message: needs the chat template")
    if messages is not None:
        raise ProtocolError(INVALID, "chat=false cannot be combined with messages")
    assert message.prompt is not None  # Generate.validate: a prompt, messages or prompt_tokens
    text = (message.system + "\n\n" + message.prompt) if message.system else message.prompt
    return list(tokenizer.encode(text, add_special_tokens=message.add_special_tokens))


def chat_tokens(
    tokenizer,
    messages: list[dict],
    tools: list[dict] | None = None,
    continue_final: bool = False,
    variables: dict | None = None,
) -> list[int]:
    """Token ids of ``messages`` through the model's chat template (``render_chat``, ``rendered_chat_tokens``)."""
    return rendered_chat_tokens(tokenizer, render_chat(tokenizer, messages, tools, continue_final, variables))


def added_bos_id(tokenizer) -> int | None:
    """The BOS id the tokenizer puts before a text it encodes with special tokens (None: it adds none)."""
    bos_id = getattr(tokenizer, "bos_token_id", None)
    if bos_id is None or list(tokenizer.encode("a", add_special_tokens=True))[:1] != [bos_id]:
        return None
    return bos_id


def without_bos_text(tokenizer, text: str) -> str:
    """A rendered chat without the template's leading BOS text, where the tokenizer adds BOS itself."""
    bos = getattr(tokenizer, "bos_token", None)
    if not isinstance(bos, str) or not bos or not text.startswith(bos) or added_bos_id(tokenizer) is None:
        return text
    return text[len(bos) :]


def rendered_chat_tokens(tokenizer, text: str) -> list[int]:
    """The token ids of a rendered chat, as llama-server makes them: where the tokenizer adds BOS, the
    template's own leading BOS text (if any) is dropped and the BOS id put first, so a chat starts with
    exactly one BOS whether or not its template writes ``bos_token``; other tokenizers' chats are the
    template's text alone. Special tokens in the text are parsed as such."""
    bos_id = added_bos_id(tokenizer)
    if bos_id is None:
        return list(tokenizer.encode(text, add_special_tokens=False))
    return [bos_id, *tokenizer.encode(without_bos_text(tokenizer, text), add_special_tokens=False)]


def render_chat(
    tokenizer,
    messages: list[dict],
    tools: list[dict] | None = None,
    continue_final: bool = False,
    variables: dict | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text of ``messages`` through the model's chat template, with ``tools`` when given and the
    template ``variables`` (``reasoning.template_variables``); with thinking off, an open thinking block is
    closed (``reasoning.close_open_thinking``). With ``continue_final`` the last message is continued
    (assistant prefill): no generation prompt, and the rendering ends where that message's content ends (the
    template's ``continue_final_message``). The text's tokens (``encode`` without special tokens) are what
    the template's own tokenizing gives.

    Raises:
        ProtocolError(INVALID): the template refuses the messages (its own error, e.g. roles that do
            not alternate) or they nest too deeply to render.
    """
    template = getattr(tokenizer, "chat_template", None)
    template = template if isinstance(template, str) else None
    variables = {**today_variables(template), **tool_list_variables(template, tools), **(variables or {})}
    extra: dict[str, Any] = {"tools": tools} if tools is not None else {}
    if continue_final:
        extra["continue_final_message"] = True
    generation_prompt = add_generation_prompt and not continue_final
    try:
        text = tokenizer.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False, **extra, **variables
        )
    except RecursionError:
        raise ProtocolError(INVALID, "messages: nested too deeply for the chat template") from None
    except Exception as error:  # noqa: BLE001 - a template's own refusal is the client's error
        if continue_final and isinstance(error, ValueError):
            # transformers: the final message's content is not found in the rendering, so it cannot be cut there
            raise ProtocolError(INVALID, f"continue_final_message: {error}") from None
        if type(error).__module__.split(".")[0] != "jinja2":
            raise
        raise ProtocolError(INVALID, f"the chat template refused the messages: {error}") from None
    if generation_prompt and thinking_off(variables):
        text = close_open_thinking(text, template)
    return text


def offered_tools(message: Generate) -> list[dict] | None:
    """The tools the chat template gets (None: no tools, or tool_choice "none")."""
    return message.tools if message.tools and message.tool_choice != "none" else None


def tool_constraint(loaded: LoadedModel, message: Generate) -> Constraint | None:
    """Check that the model can take the request's tools; the grammar that enforces "required" or a
    named function (None otherwise). Raises ProtocolError(INVALID)."""
    if not message.tools or message.tool_choice == "none":
        return None  # tools not offered: no call can happen, so any model takes them
    problem = tool_support_problem(loaded.tokenizer)
    if problem is not None:
        raise ProtocolError(INVALID, f"tools: {problem}")
    if message.chat is False or (message.prompt_tokens is not None):
        raise ProtocolError(INVALID, "tools: need a chat request (messages, or a prompt through the chat template)")
    if message.tool_choice != "required" and message.tool_name is None:
        return None
    if message.constraint is not None:
        raise ProtocolError(INVALID, "constraint: cannot be combined with a required tool call")
    try:
        return Constraint(kind="lark", text=required_call_grammar(loaded.tokenizer, message.tools, message.tool_name))
    except ValueError as error:
        raise ProtocolError(INVALID, f"tool_choice: {error}") from error


def sampling_params(message: Generate, defaults: Sampling) -> SamplingParams:
    """The engine's sampler settings for a Generate: its own ``sampling``, else the daemon's defaults."""
    sampling = message.sampling if message.sampling is not None else defaults
    return SamplingParams(
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        min_p=sampling.min_p,
        repetition_penalty=sampling.repetition_penalty,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        logit_bias=tuple(sorted(sampling.logit_bias.items())),
        seed=sampling.seed,
        logprobs=sampling.logprobs,
        post_sampling=sampling.post_sampling,
        rng=sampling.rng,
    )


def check_post_sampling(params: SamplingParams, ignore_eos: bool) -> None:
    """Post-sampling logprobs describe top_k / top_p / min_p and the temperature over the model's logits;
    the logit changes before them (penalties, logit_bias, a grammar, ignore_eos) are not in that account,
    so they are refused together. Raises ProtocolError(INVALID)."""
    changed = [
        name
        for name, on in (
            ("repetition_penalty", params.repetition_penalty not in (0.0, 1.0)),
            ("presence_penalty", bool(params.presence_penalty)),
            ("frequency_penalty", bool(params.frequency_penalty)),
            ("logit_bias", bool(params.logit_bias)),
            ("constraint", params.grammar is not None),
            ("ignore_eos", ignore_eos),
        )
        if on
    ]
    if changed:
        raise ProtocolError(INVALID, f"sampling.post_sampling: cannot be combined with {', '.join(changed)}")


def to_request(
    loaded: LoadedModel,
    message: Generate,
    internal_id: str,
    defaults: Sampling,
    grammar_limits: GrammarLimits | None = None,
    reasoning: str = "auto",
) -> Request:
    """Build the scheduler request for a Generate. Raises ProtocolError(INVALID) for bad input (what needs
    the engine, such as the sampler rules that need the vocabulary, is checked when the scheduler takes the
    request). Touches no daemon state, so it may run on a host-work thread (``host_work``)."""
    tools_grammar = tool_constraint(loaded, message)  # first: a model that cannot take tools says so
    # the prompt's own check is the protocol's (Generate.validate); whether the request can run here is the
    # engine's one admissibility check (Engine.check_request, asked when the scheduler takes the request: a
    # prompt of no tokens, the context bound, the KV pool)
    tokens = prompt_tokens(loaded, message, reasoning)
    params = sampling_params(message, defaults)
    constraint = tools_grammar or message.constraint
    if constraint is not None:
        try:
            grammar = compile_grammar(loaded, constraint.kind, constraint.text, grammar_limits)
        except GrammarError as error:
            raise ProtocolError(INVALID, f"constraint: {error}") from error
        params = replace(params, grammar=grammar)
    if params.post_sampling:
        check_post_sampling(params, message.ignore_eos)
    speculative = SpeculativeRequest()
    if message.speculative is not None:
        kind = message.speculative.kind
        speculative = SpeculativeRequest(
            enabled=None if kind is None else kind == "prompt-lookup",
            max_draft=message.speculative.max_draft,
        )
    text = TextStream(loaded.new_detokenizer(), list(message.stop))
    prediction = None
    if message.prediction:
        if len(message.prediction) > MAX_CHARS_PER_TOKEN * loaded.context_length:
            raise ProtocolError(INVALID, "prediction: longer than the model's context could ever use")
        prediction = list(loaded.tokenizer.encode(message.prediction, add_special_tokens=False))
    return Request(
        internal_id,
        tokens,
        params,
        message.max_tokens,
        text,
        speculative,
        ignore_eos=message.ignore_eos,
        cache_prompt=message.cache_prompt,
        prediction=prediction,
        shared_drafts=message.shared_drafts,
        draft_key=message.draft_key,
        context_keep=context_keep(loaded, message, tokens),
        context_discard=message.n_discard,
    )


def context_keep(loaded: LoadedModel, message: Generate, tokens: list[int]) -> int:
    """The leading tokens a context shift keeps, as llama-server counts them: ``n_keep`` (-1: the whole
    prompt), plus one when the prompt starts with the BOS token (llama-server adds one for its BOS)."""
    keep = len(tokens) if message.n_keep < 0 else message.n_keep
    bos = getattr(loaded.tokenizer, "bos_token_id", None)
    return keep + (1 if bos is not None and tokens and tokens[0] == bos else 0)


def tool_call_splitter(loaded: LoadedModel, message: Generate) -> ToolCallSplitter | None:
    """The splitter that takes tool calls out of a request's text (None when it offers no tools)."""
    tools = offered_tools(message)
    return ToolCallSplitter(loaded.tokenizer, tools) if tools is not None else None


def to_reply(event, client_id: str, stream: bool, splitter: ToolCallSplitter | None = None):
    """The wire message for a scheduler event (None when nothing is sent). With a ``splitter`` (a request
    with tools) text inside tool calls is held back from the chunks and the Done carries the parsed calls."""
    if isinstance(event, TokenEvent):
        text = splitter.push(event.text) if splitter is not None else event.text
        if not stream:
            return None
        return Chunk(id=client_id, tokens=list(event.tokens), text=text, logprobs=event.logprobs)
    assert isinstance(event, FinishEvent)
    if event.finish_reason == "error":
        return failure_reply(client_id, event.error)
    text, tool_calls = event.text, None
    if splitter is not None:
        splitter.finish()
        text, tool_calls = splitter.content, splitter.calls
    return Done(
        id=client_id,
        finish_reason=event.finish_reason,
        text=text,
        tokens=list(event.tokens),
        usage=event.usage,
        timings=event.timings,
        tool_calls=tool_calls,
        truncated=event.truncated,
    )


def failure_reply(client_id: str, error: str | None) -> Error:
    """The Error for a generation that failed. The scheduler's reason may start with a Python exception's
    name (the daemon's log keeps it): a grammar that became too complex to follow is the request's own
    problem (invalid_request, with the grammar's message, written for the user); any other exception is
    reported without its name or text, which may hold paths or library state."""
    text = error or ""
    named = _EXCEPTION_PREFIX.match(text)
    if named is None:
        return Error(id=client_id, code=INTERNAL, message=error or "generation failed")
    if named.group(1) == "GrammarError":
        return Error(id=client_id, code=INVALID, message=f"constraint: {text[named.end() :]}")
    return Error(id=client_id, code=INTERNAL, message="generation failed inside the daemon (its log has the details)")


def tick_message(record: TickRecord) -> Tick:
    """The trace message for a tick the scheduler recorded."""
    return Tick(
        tick=record.tick,
        batch=record.batch,
        pipelined=record.pipelined,
        rows=[
            TickRow(row.request_id, row.action, row.drafted, row.accepted, row.detail, row.tokens)
            for row in record.rows
        ],
        duration_ms=record.duration_ms,
        prefill_tokens=record.prefill_tokens,
        steps=record.steps,
    )
