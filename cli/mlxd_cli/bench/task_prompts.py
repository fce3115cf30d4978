"""The ``extract`` and ``agent`` prompt styles of mlx-bench: many requests that fill the same shape.

Contract:
    * Both are generated in code from the word lists below (no download), deterministic per
      ``(seed, key)`` like the paragraphs of ``prompts.py`` (``random.Random`` seeded with a string).
    * ``extract_prompt(seed, key)``: one record of a person or a product, told in prose, and the request to
      return it as one JSON object with the fields named in a sentence; no schema and no example is given,
      so the JSON shape (key order, quoting, punctuation) a reply uses is in no prompt: a server sees it only
      in earlier replies. Every record differs (names, numbers, places). Persons and products alternate
      by the key's hash, so a batch holds both.
    * ``agent_prompt(seed, key, step)``: one step of a coding agent's loop on a small fixed project. The
      prompt names the tools in prose and tells what happened so far in prose (the observations, never the
      earlier tool calls), then asks for the next tool call as JSON. Steps 0 to ``AGENT_STEPS - 1`` ask to
      read the file, run its tests, write the fix and run the tests again; the calls a step's reply makes
      (``{"tool": "read_file", "args": {"path": "inventory/pricing.py"}}``, the same helper code) repeat
      what earlier sessions' replies made, on other functions of the same files, but are not in the prompt.
    * Both prompts are short (about 80-140 estimated tokens) whatever ``--prompt-tokens`` says.
"""

from __future__ import annotations

import random

AGENT_STEPS = 4

_FIRST_NAMES = """
Maria Jonas Aiko Pedro Fatima Liam Chen Olga Kwame Sofia Mateo Ingrid Ravi Lucia Tomas Amara Hugo Elena
Yusuf Clara Nikolai Zara Felix Mei
""".split()
_LAST_NAMES = """
Lopez Berg Tanaka Silva Haddad Walsh Wei Petrova Mensah Rossi Garcia Lund Sharma Costa Novak Okafor Laurent
Ivanova Demir Becker Popov Khan Schmidt Lin
""".split()
_CITIES = """
Lisbon Oslo Osaka Recife Beirut Dublin Chengdu Kazan Accra Turin Seville Bergen Pune Porto Brno Lagos Lyon
Minsk Izmir Leipzig Tomsk Lahore Graz Taipei
""".split()
_JOBS = """
baker nurse engineer teacher pilot librarian carpenter chemist architect translator farmer journalist
electrician pharmacist surveyor designer
""".split()
_HOBBIES = """
cycling chess climbing painting swimming gardening photography rowing pottery sailing running knitting
""".split()
_BRANDS = "Acme Northwind Globex Initech Umbrella Vortex Zenith Orion Polaris Summit".split()
_PRODUCTS = "lantern kettle backpack drill blender tent headphones jacket camera bicycle lamp toaster".split()
_COLORS = "green black silver red blue white orange grey".split()
_CATEGORIES = "outdoor kitchen tools audio clothing home sports electronics".split()

_FILES = {
    "inventory/pricing.py": ["parse_price", "apply_discount", "round_total", "convert_currency"],
    "inventory/stock.py": ["reserve_items", "release_items", "count_available", "restock"],
    "inventory/orders.py": ["create_order", "cancel_order", "order_total", "validate_address"],
}
_BUGS = (
    "returns a string where a float is expected",
    "raises KeyError when the item is missing",
    "ignores the quantity argument",
    "fails on an empty list",
    "rounds half values down instead of up",
    "does not strip spaces from its input",
)


def extract_prompt(seed: int, key: str) -> str:
    """A record in prose and the request to return it as one JSON object (module docstring).

    Args:
        seed: The run's ``--seed``.
        key: What distinguishes this request (e.g. ``"extract/r0/c4/i2"``).

    Returns:
        The prompt text.
    """
    rng = random.Random(f"mlx-bench:{seed}:{key}")
    if rng.random() < 0.5:
        first, last, city = rng.choice(_FIRST_NAMES), rng.choice(_LAST_NAMES), rng.choice(_CITIES)
        age, job = rng.randint(19, 78), rng.choice(_JOBS)
        hobbies = rng.sample(_HOBBIES, 2)
        pronoun = rng.choice(("She", "He"))
        record = (
            f"{first} {last} is a {age}-year-old {job} who lives in {city}. "
            f"{pronoun} can be reached at {first.lower()}.{last.lower()}@example.com and likes "
            f"{hobbies[0]} and {hobbies[1]}."
        )
        fields = "name, age, city, occupation, email and hobbies (a list)"
        kind = "person"
    else:
        brand, product, color = rng.choice(_BRANDS), rng.choice(_PRODUCTS), rng.choice(_COLORS)
        model = f"{rng.choice('ABCDEFGHKLMNPRSTX')}{rng.randint(2, 990)}"
        price, weight = rng.randint(5, 900) + rng.choice((0.0, 0.49, 0.99)), round(rng.uniform(0.1, 12.0), 1)
        stock = rng.choice(("is in stock", "is sold out"))
        record = (
            f"The {brand} {product} {model} comes in {color}, weighs {weight} kg and costs {price:.2f} dollars. "
            f"It belongs to the {rng.choice(_CATEGORIES)} range and {stock}."
        )
        fields = "name, model, color, weight_kg, price, category and in_stock (true or false)"
        kind = "product"
    return (
        f"Extract the {kind} described below into one JSON object with the fields {fields}. "
        f"Answer with the JSON object only.\n\n{record}"
    )


def agent_prompt(seed: int, key: str, step: int) -> str:
    """Step ``step`` (0-based, below ``AGENT_STEPS``) of one coding-agent session (module docstring).

    Args:
        seed: The run's ``--seed``.
        key: The session (e.g. ``"agent/r0/c4/s1"``); its steps share the task.
        step: Which step of the loop this request is.

    Returns:
        The prompt text.
    """
    rng = random.Random(f"mlx-bench:{seed}:{key}")
    path = rng.choice(sorted(_FILES))
    function = rng.choice(_FILES[path])
    bug = rng.choice(_BUGS)
    test_path = "tests/test_" + path.rsplit("/", 1)[1]
    progress = [
        "Nothing has been done yet.",
        f"You read {path}; {function} is defined near the top of the file.",
        f"You read {path} and ran {test_path}: 2 tests failed in {function}.",
        f"You read {path}, ran {test_path} (2 failures in {function}) and wrote a fixed {path}.",
    ][step % AGENT_STEPS]
    return (
        "You are a coding agent in the Python project inventory. Tools: read_file (argument path), "
        "run_tests (argument path), write_file (arguments path and content, the whole new file). "
        'Answer with exactly one tool call as a JSON object {"tool": ..., "args": {...}}; when you write a '
        "file, give its whole content.\n\n"
        f"Task: {function} in {path} {bug}. Fix it so that {test_path} passes.\n"
        f"Progress: {progress}\n"
        "Next tool call:"
    )
