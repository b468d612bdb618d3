"""`train ppo` beside and against real `ray start` clusters on this machine: a local run beside a running
head node, CPU over-requests, unreachable heads and token authentication, each a one-line error.

Each head node runs `ray start --head --block` in its own temporary directory (RAY_TMPDIR, so no other
Ray on the machine sees it), on a free port with one CPU, and is stopped by terminating that process
(which stops the node's processes) at the end of the module.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("ray.rllib")

from resilibench.cli import main

TYPE = "simple_data_transformation"
TINY_FLAGS = ["--task-type", TYPE, "--num-env-runners", "0", "--num-envs-per-env-runner", "4",
              *[x for kv in ("d_model=16", "n_heads=2", "ff_dim=32", "train_batch_size=256", "minibatch_size=128",
                             "num_epochs=1", "value_hiddens=[16]") for x in ("--set", kv)]]
TOKEN = "resilibench-test-token-0123456789abcdef"


@dataclass
class Head:
    address: str  # HOST:PORT of the head's GCS
    temp_dir: Path  # its RAY_TMPDIR: `ray.init()` with this RAY_TMPDIR finds the head as `ray start` left it


def _start_head(extra_env: dict[str, str]) -> Iterator[Head]:
    temp_dir = Path(tempfile.mkdtemp(prefix="rb-ray-", dir="/tmp"))  # short: Ray's socket paths have a limit
    env = {**os.environ, "RAY_TMPDIR": str(temp_dir), **extra_env}
    log = open(temp_dir / "head.log", "w")  # noqa: SIM115 (closed below)
    head = subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--port", "0",
                             "--num-cpus", "1", "--include-dashboard", "false", "--disable-usage-stats"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    address_file = temp_dir / "ray" / "ray_current_cluster"
    try:
        deadline = time.monotonic() + 240  # a loaded 2-core machine can take minutes
        while not address_file.is_file() or not address_file.read_text().strip():
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start did not come up: {(temp_dir / 'head.log').read_text()[-2000:]}")
            time.sleep(0.5)
        yield Head(address_file.read_text().strip(), temp_dir)
    finally:
        head.terminate()  # `ray start --block` stops its node's processes on SIGTERM
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def head() -> Iterator[Head]:
    yield from _start_head({})


@pytest.fixture(scope="module")
def token_head() -> Iterator[Head]:
    yield from _start_head({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_line_error(capsys, argv: list[str], max_seconds: float) -> str:
    started = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - started < max_seconds
    err = capsys.readouterr().err.strip()
    assert err.startswith("resilibench: error: train ppo: ") and "Traceback" not in err
    return err.splitlines()[-1]


@pytest.mark.slow
def test_train_without_address_runs_locally_beside_a_ray_start_cluster(head, tmp_path, monkeypatch, capsys):
    """The head node the docs tell users to start: `ray.init()` would attach to it (and refuse num_cpus);
    `train ppo` without --address starts its own local instance instead."""
    monkeypatch.setenv("RAY_TMPDIR", str(head.temp_dir))
    out = tmp_path / "run"
    assert main(["train", "ppo", "--iterations", "1", "--output-dir", str(out), *TINY_FLAGS]) == 0
    assert "trained to iteration 1" in capsys.readouterr().err
    import ray

    assert not ray.is_initialized()  # the local instance was stopped; the cluster runs on
    assert subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "status", "--address", head.address],
                          capture_output=True, timeout=120).returncode == 0


@pytest.mark.slow
def test_more_cpus_than_the_cluster_has_is_refused_up_front(head, tmp_path, capsys):
    argv = ["train", "ppo", "--address", head.address, "--iterations", "1", "--output-dir", str(tmp_path / "run"),
            *TINY_FLAGS, "--num-env-runners", "2"]
    line = _one_line_error(capsys, argv, max_seconds=60)
    assert "num_env_runners: 2 env runner(s) + 0 CPU learner(s) need 2 CPU(s), the Ray cluster has 1" in line
    import ray

    assert not ray.is_initialized()


def test_unreachable_head_is_a_quick_one_line_error(tmp_path, capsys):
    address = f"127.0.0.1:{_free_port()}"
    line = _one_line_error(capsys, ["train", "ppo", "--address", address, "--iterations", "1",
                                    "--output-dir", str(tmp_path / "run"), *TINY_FLAGS], max_seconds=30)
    assert f"address {address}: no Ray head node answers at " in line and "Connection refused" in line
    from resilibench.policies.ppo.training import RayClusterError, probe_ray_head

    # ray:// needs the Ray Client (the `cluster` extra): without it the error names the extra instead
    client = importlib.util.find_spec("grpc") is not None
    expected = "no Ray head node answers" if client else r"ray:// addresses need the Ray Client: pip install"
    with pytest.raises(RayClusterError, match=expected):
        probe_ray_head(f"ray://127.0.0.1:{_free_port()}")


@pytest.mark.slow
def test_token_authentication_is_a_quick_one_line_error(token_head, tmp_path, capsys, monkeypatch):
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ray/auth_token either
    line = _one_line_error(capsys, ["train", "ppo", "--address", token_head.address, "--iterations", "1",
                                    "--output-dir", str(tmp_path / "run"), *TINY_FLAGS], max_seconds=30)
    assert "uses token authentication and refused this process: set RAY_AUTH_MODE=token" in line
    script = f"from resilibench.policies.ppo.training import probe_ray_head; probe_ray_head({token_head.address!r})"
    with_token = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}
    assert subprocess.run([sys.executable, "-c", script], env=with_token, timeout=120).returncode == 0


def test_ray_client_address_without_ray_client_names_the_extra(monkeypatch):
    from resilibench.policies.ppo.training import RayClusterError, probe_ray_head

    monkeypatch.setitem(sys.modules, "grpc", None)  # as without ray[client]: `import grpc` fails
    with pytest.raises(RayClusterError, match=r"ray:// addresses need the Ray Client: pip install 'ray\[client\]=="):
        probe_ray_head("ray://127.0.0.1:10001")
