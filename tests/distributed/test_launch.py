"""The launcher's use of torch's elastic agent: where worker logs go, which of the agent's
log lines reach the terminal, and what it leaves behind in this process."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from qtrain.distributed import launch


def test_worker_logs_go_to_the_run_directory_and_nothing_else_of_elastics(
    tmp_path: Path,
) -> None:
    envs = {0: {"RANK": "0"}, 1: {"RANK": "1"}}
    dest = launch.RunDirLogs(tmp_path).reify(envs)
    assert dest.stderrs == {0: str(tmp_path / "worker-0.log"), 1: str(tmp_path / "worker-1.log")}
    assert dest.stdouts == {0: os.devnull, 1: os.devnull}
    assert dest.error_files == {0: os.devnull, 1: os.devnull}
    assert not dest.tee_stdouts and not dest.tee_stderrs  # rank 0 is forwarded by qtrain
    assert "TORCHELASTIC_ERROR_FILE" not in envs[0]
    assert list(tmp_path.iterdir()) == []  # the agent's Popen creates the logs, nothing else


def test_only_elastic_errors_the_launcher_does_not_tell_reach_the_terminal(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOGLEVEL", raising=False)
    api = logging.getLogger("torch.distributed.elastic.multiprocessing.api")
    agent = logging.getLogger("torch.distributed.launcher.api")
    with launch._quiet_elastic():
        api.warning("Sending process %s closing signal %s", 1, "SIGTERM")
        agent.warning("config has no run_id")
        api.error("failed (exitcode: %s) local_rank: %s", -9, 1)  # the launcher's line says it
        api.error("Process %s did not exit after SIGKILL", 7)
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "ERROR torch.distributed.elastic.multiprocessing.api: Process 7 did not exit after SIGKILL"
    ]
    assert logging.getLogger("torch.distributed.elastic").propagate  # put back
    assert not logging.getLogger("torch.distributed.elastic").handlers


def test_the_environment_and_signal_handlers_are_put_back() -> None:
    from torch.distributed.elastic.multiprocessing.api import _terminate_process_handler

    saved = signal.getsignal(signal.SIGTERM)
    threads = os.environ.get("OMP_NUM_THREADS")
    with (
        launch._environ(QTRAIN_RUN_DIR="/x", OMP_NUM_THREADS="3"),
        launch._own_signal_handlers(),
    ):
        assert os.environ["QTRAIN_RUN_DIR"] == "/x"
        os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = "SIGTERM"  # as launch_agent does
        signal.signal(signal.SIGTERM, _terminate_process_handler)  # as the agent does
    assert signal.getsignal(signal.SIGTERM) == saved
    assert "TORCHELASTIC_SIGNALS_TO_HANDLE" not in os.environ
    assert os.environ.get("QTRAIN_RUN_DIR") is None
    assert os.environ.get("OMP_NUM_THREADS") == threads


def test_an_agent_that_cannot_start_fails_the_run_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from qtrain.errors import RunFailed
    from qtrain.recipe import build_recipe

    raw = {
        "model": {"name": "gcn", "hidden": 8},
        "dataset": {"name": "synthetic-small", "nodes": 300},
        "train": {"epochs": 1},
        "distributed": {"world_size": 2},
        "output": {"dir": str(tmp_path / "runs")},
    }
    with socket.socket() as busy:  # the rendezvous port is taken before the agent binds it
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        monkeypatch.setattr(launch, "_free_port", lambda: busy.getsockname()[1])
        with pytest.raises(RunFailed, match=r"the elastic launcher failed: .*no worker is left"):
            launch.launch(build_recipe(raw, "busy"))
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
    assert "TORCHELASTIC_SIGNALS_TO_HANDLE" not in os.environ


# Counts SIGTERMs in Python, partitions with METIS, then sends itself two SIGTERMs.
_METIS_THEN_TWO_SIGTERMS = """
import os, signal, sys
from qtrain._compat import import_dgl
from qtrain.distributed.launch import _rearm_sigterm
from qtrain.distributed.partition import assign_parts

seen = []
signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
assign_parts(import_dgl().rand_graph(300, 3000), 2, "metis", 0)
if sys.argv[1] == "rearm":
    _rearm_sigterm()
os.kill(os.getpid(), signal.SIGTERM)
os.kill(os.getpid(), signal.SIGTERM)
print(len(seen))
"""


def test_sigterm_is_handled_every_time_after_metis() -> None:
    """GKlib leaves SIGTERM's handler one-shot: without re-arming, the second SIGTERM
    (the parent-death signal comes twice when a launcher is killed) kills rank 0."""

    def run(how: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", _METIS_THEN_TWO_SIGTERMS, how],
            capture_output=True,
            text=True,
            timeout=120,
        )

    if run("as-is").returncode != -signal.SIGTERM:
        pytest.skip("this METIS build leaves SIGTERM's handler as it found it")
    done = run("rearm")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-1] == "2"
