"""The refusal benchmark's arms and its renice of a process group (eval/bench/refusal_latency.py)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eval.bench.refusal_latency import Arm, parse_arms, renice_group, run_summary


def test_arms_are_server_nice_and_switch_interval() -> None:
    arms = parse_arms("uvloop:0,asyncio:0,uvloop:10,uvloop:0:0.5")
    assert arms == [
        Arm("uvloop", 0),
        Arm("asyncio", 0),
        Arm("uvloop", 10),
        Arm("uvloop", 0, 0.5),
    ]
    # A renice shares the service process; another switch interval needs its own.
    assert [arm.service for arm in arms] == ["uvloop", "asyncio", "uvloop", "uvloop-switch0.5"]
    assert arms[3].name == "uvloop:0:0.5"
    for bad in ("uvloop", "tornado:0", "uvloop:x", "uvloop:0:x", "uvloop:0:1:2"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"SERVER:NICE\[:SWITCH_MS\]"):
            parse_arms(bad)


def test_the_summary_of_a_run_is_json_with_the_arms_by_name(tmp_path: Path) -> None:
    args = argparse.Namespace(out=tmp_path / "r.json", arms=parse_arms("uvloop:0,uvloop:0:1"))
    summary = run_summary(args, {"uvloop:0": {"probes": 1}}, ["--arms", "uvloop:0,uvloop:0:1"])
    assert json.loads(json.dumps(summary))["config"] == {
        "out": str(tmp_path / "r.json"),
        "arms": ["uvloop:0", "uvloop:0:1"],
    }
    assert summary["command"].endswith("--arms uvloop:0,uvloop:0:1")


def test_renice_reaches_every_thread_of_the_group() -> None:
    code = "import threading, time; threading.Thread(target=time.sleep, args=(30,)).start(); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    try:
        tasks = f"/proc/{child.pid}/task"
        deadline = time.monotonic() + 10
        while len(os.listdir(tasks)) < 2:
            assert time.monotonic() < deadline, "the child's second thread never started"
            time.sleep(0.01)
        assert renice_group(child.pid, 7) == 2
        assert [os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(tasks)] == [7, 7]
    finally:
        child.kill()
        child.wait()
