"""A child process group that outlives the process that started it, found again through a pid
file: the mechanism under `SGLangServer` and `SGLangRouter`.

The child is started in a session of its own, so its pid is also its process-group id and
stopping it signals every process it spawned (SGLang's scheduler and detokenizer, the router's
threads). The pid file is trusted only while that group is alive and the leader's command line
still carries the expected marker, which guards against a recycled pid. Failures raise
`SGLangServerError` with the log's tail.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

from generation.errors import SGLangServerError

logger = logging.getLogger(__name__)

_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


class PidFileProcess:
    """One child process group, its pid kept in ``pid_path`` and its output in ``log_path``.

    ``name`` is used in messages; ``marker`` must occur in the leader's ``/proc/<pid>/cmdline``
    for a pid file to be believed.
    """

    def __init__(self, name: str, pid_path: Path, log_path: Path, marker: bytes) -> None:
        self.name = name
        self.pid_path = pid_path
        self.log_path = log_path
        self._marker = marker
        self._process: subprocess.Popen[bytes] | None = None

    def running_pid(self) -> int | None:
        """The pid (= process group) from the pid file, if that group still runs our program."""
        try:
            pid = int(self.pid_path.read_text().strip())
        except (OSError, ValueError):
            return None
        if not group_alive(pid) or not _cmdline_has(pid, self._marker):
            return None
        return pid

    def spawn(self, argv: Sequence[str], env: dict[str, str]) -> None:
        """Start argv in a new session with its output in the log; record its pid."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.pid_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with self.log_path.open("wb") as log:
                self._process = subprocess.Popen(
                    list(argv),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    start_new_session=True,
                )
        except OSError as exc:
            raise SGLangServerError(f"could not start {self.name}: {exc}") from exc
        self.pid_path.write_text(f"{self._process.pid}\n")

    def wait_ready(self, probe: Callable[[float], bool], timeout_s: float) -> float:
        """Poll ``probe(remaining_s)`` until it is true; return the seconds waited.

        Stops the group and raises if the child exits or the time runs out.
        """
        started = time.monotonic()
        deadline = started + timeout_s
        while time.monotonic() < deadline:
            self._raise_if_exited()
            if probe(max(deadline - time.monotonic(), 5.0)):
                return time.monotonic() - started
            time.sleep(0.5)
        self.stop()
        raise SGLangServerError(
            f"{self.name} did not become ready within {timeout_s:.0f} s; "
            f"log {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def _raise_if_exited(self) -> None:
        if self._process is None or self._process.poll() is None:
            return
        code = self._process.returncode
        self.stop()
        raise SGLangServerError(
            f"{self.name} exited early with code {code}; "
            f"log {self.log_path}:\n{log_tail(self.log_path)}"
        )

    def stop(self, timeout_s: float = 15.0) -> bool:
        """SIGTERM the group, SIGKILL after timeout_s; True if something was stopped."""
        pid = self.running_pid()
        stopped = False
        if pid is not None:
            stopped = signal_group(pid, signal.SIGTERM)
            if not self._wait_group_gone(pid, timeout_s):
                logger.warning("%s ignored SIGTERM, killing pgid=%d", self.name, pid)
                signal_group(pid, signal.SIGKILL)
                self._wait_group_gone(pid, 5.0)
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(timeout=1.0)
            self._process = None
        self.pid_path.unlink(missing_ok=True)
        return stopped

    def _wait_group_gone(self, pgid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process is not None:
                self._process.poll()  # reap our own child so it does not linger as a zombie
            if not group_alive(pgid):
                return True
            time.sleep(0.1)
        return not group_alive(pgid)


def log_tail(path: Path, lines: int = 40) -> str:
    """The last lines of a log, without terminal colour codes (the router writes them)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return _ANSI_ESCAPE.sub("", "\n".join(text.splitlines()[-lines:]))


def http_ok(url: str, timeout_s: float) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex((host, port)) == 0


def signal_group(pgid: int, sig: signal.Signals) -> bool:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError as exc:
        raise SGLangServerError(f"cannot signal process group {pgid}: {exc}") from exc
    return True


def _cmdline_has(pid: int, marker: bytes) -> bool:
    """Guards against a recycled pid. A pid is not reused while its process group lives, so a
    gone or zombie leader (empty cmdline) with live members is still ours."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return not cmdline or marker in cmdline


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in process group pgid."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command: state ppid pgrp ...
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False
