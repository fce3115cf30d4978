"""mlx-bench's extract and agent styles: generated in code, deterministic, varied, and their replies' shape
is named but never shown in the prompt."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from mlxd_cli.bench.main import main as bench_main
from mlxd_cli.bench.prompts import PROMPT_STYLES, PromptBook, estimate_tokens, style_prompt
from mlxd_cli.bench.task_prompts import AGENT_STEPS, agent_prompt, extract_prompt


def test_the_styles_are_offered():
    assert {"plain", "copy", "chat", "extract", "agent"} == set(PROMPT_STYLES)
    for style in ("extract", "agent"):
        with pytest.raises(ValueError, match="PromptBook.prompt"):
            style_prompt(style, "Some text.")


def test_extract_prompts_are_records_of_people_and_products_in_one_named_shape():
    book = PromptBook(seed=5, prompt_tokens=200)
    prompts = [book.prompt("extract", "0", 4, i) for i in range(24)]
    assert len(set(prompts)) == 24  # every record differs
    people = [p for p in prompts if "extract the person" in p.lower()]
    products = [p for p in prompts if "extract the product" in p.lower()]
    assert people and products and len(people) + len(products) == 24
    for prompt in people:
        assert "name, age, city, occupation, email and hobbies" in prompt and "@example.com" in prompt
    for prompt in products:
        assert "name, model, color, weight_kg, price, category and in_stock" in prompt and "dollars" in prompt
    for prompt in prompts:
        assert "{" not in prompt and '"' not in prompt  # no schema and no example: the shape is not shown
        assert 30 <= estimate_tokens(prompt) <= 140
    assert prompts == [PromptBook(seed=5, prompt_tokens=10).prompt("extract", "0", 4, i) for i in range(24)]
    assert prompts != [PromptBook(seed=6, prompt_tokens=200).prompt("extract", "0", 4, i) for i in range(24)]
    assert extract_prompt(5, "extract/r0/c4/i3") == prompts[3]


def test_agent_prompts_are_steps_of_sessions_that_never_show_a_tool_call():
    book = PromptBook(seed=2, prompt_tokens=200)
    prompts = [book.prompt("agent", "1", 1, i) for i in range(3 * AGENT_STEPS)]
    for session in range(3):
        steps = prompts[session * AGENT_STEPS : (session + 1) * AGENT_STEPS]
        tasks = {prompt.split("Task: ")[1].split("\n")[0] for prompt in steps}
        assert len(tasks) == 1  # one task per session, its steps differ in progress only
        assert len(set(steps)) == AGENT_STEPS
        assert "Nothing has been done yet." in steps[0] and "wrote a fixed" in steps[-1]
        assert steps[0] == agent_prompt(2, f"agent/r1/c1/s{session}", 0)
    for prompt in prompts:
        assert "read_file" in prompt and "run_tests" in prompt and "write_file" in prompt
        assert '"path"' not in prompt and '"read_file"' not in prompt  # the calls are in no prompt
        assert prompt.endswith("Next tool call:")
        assert 60 <= estimate_tokens(prompt) <= 160
    assert prompts == [PromptBook(seed=2, prompt_tokens=200).prompt("agent", "1", 1, i) for i in range(12)]


def test_the_command_line_takes_the_styles():
    result = CliRunner().invoke(bench_main, ["--target", "a=http://127.0.0.1:9", "--prompt-style", "extract,poem"])
    assert result.exit_code == 2 and "poem" in result.output and "extract" in result.output
    assert json.dumps(list(PROMPT_STYLES))  # plain data
