"""Start ``rollout serve`` as a child process for the trainer, and stop it.

``launch()`` runs the engine on a free loopback port with a fresh bearer token (handed to the child
in ``$ROLLOUT_TOKEN``, never on its command line), waits until ``GET /health`` answers, and returns a
:class:`LaunchedEngine` that stops it on ``with`` exit, on :meth:`LaunchedEngine.stop` and at
interpreter exit. Its output goes to ``<run_dir>/serve.log``; a start that fails raises
:class:`LaunchError` ending with the log's last lines.

Which command is run: ``command=`` if given (a list, e.g. ``["node", "--import", "tsx",
"src/cli/main.ts"]`` in a clone of the repository, with ``cwd=`` the clone), else
``$ROLLOUT_COMMAND`` (split like a shell would), else ``rollout`` on ``PATH`` (``npm install -g``
or ``npm link`` of the engine puts it there).
"""
from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Set, Union

from .client import ControlClient, RetryPolicy
from .errors import LaunchError, RolloutEngineError

PathLike = Union[str, "os.PathLike[str]"]

_LISTENING = re.compile(r"control API listening on (http://\S+)")
_LOG_TAIL_LINES = 40


def default_command() -> List[str]:
    """The command that runs the ``rollout`` CLI: ``$ROLLOUT_COMMAND``, else ``rollout`` on PATH."""
    configured = os.environ.get("ROLLOUT_COMMAND")
    if configured:
        return shlex.split(configured)
    found = shutil.which("rollout")
    if found:
        return [found]
    raise LaunchError(
        "no `rollout` command: pass command=[...], set $ROLLOUT_COMMAND (e.g. 'npx rollout' in a project that"
        " depends on rollout-engine), or put the engine's CLI on PATH (npm link in its clone)"
    )


class LaunchedEngine:
    """A running ``rollout serve``: its URL and token, a client for it, and its stop.

    The port, token and run dir are kept across :meth:`restart`, so a client keeps working through a
    restart (its retries outlast the gap).
    """

    def __init__(self, argv: List[str], env: Dict[str, str], cwd: Optional[str], run_dir: Path, token: str, host: str, startup_timeout_s: float) -> None:
        self._argv = argv
        self._env = env
        self._cwd = cwd
        self.run_dir = run_dir
        self.token = token
        self._host = host
        self._startup_timeout_s = startup_timeout_s
        self.log_path = run_dir / "serve.log"
        self.url = ""
        self.port = 0
        self._process: Optional["subprocess.Popen[bytes]"] = None

    @property
    def pid(self) -> Optional[int]:
        return None if self._process is None else self._process.pid

    def client(self, **options: Any) -> ControlClient:
        """A :class:`ControlClient` for this engine, with its token."""
        return ControlClient(self.url, self.token, **options)

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def log(self) -> str:
        """Everything the engine wrote (stdout and stderr) since it was launched."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def start(self, *, resume: bool = False) -> "LaunchedEngine":
        """Start the process (first on port 0, then on the port it got) and wait until it answers."""
        if self.running():
            raise LaunchError(f"rollout serve is already running (pid {self.pid})")
        # --stop-with-stdin: the engine stops when this pipe closes, which the kernel does when the
        # trainer dies in any way (SIGKILL, an OOM kill), where atexit never runs.
        argv = list(self._argv) + ["--port", str(self.port), "--stop-with-stdin"] + (["--resume"] if resume else [])
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.PIPE, env=self._env, cwd=self._cwd)
        deadline = time.monotonic() + self._startup_timeout_s
        url = None
        while url is None:
            match = _LISTENING.search(self.log()[offset:])
            if match:
                url = match.group(1)
                break
            code = self._process.poll()
            if code is not None:
                self._process = None
                raise LaunchError(f"rollout serve exited with code {code} before it listened ({shlex.join(argv)})", self.log_tail(), code)
            if time.monotonic() > deadline:
                self.kill()
                raise LaunchError(f"rollout serve did not listen within {self._startup_timeout_s:g} s ({shlex.join(argv)})", self.log_tail())
            time.sleep(0.05)
        self.url = url
        self.port = urllib.parse.urlsplit(url).port or 0
        _launched.add(self)
        try:
            with self.client(retry=RetryPolicy(attempts=20, backoff_s=0.05, max_backoff_s=0.5)) as probe:
                probe.health()
        except RolloutEngineError as err:
            self.kill()
            raise LaunchError(f"rollout serve listened on {url} but GET /health failed: {err}", self.log_tail()) from None
        return self

    def stop(self, timeout_s: float = 60.0) -> Optional[int]:
        """SIGTERM (the engine brings its groups home and checkpoints), SIGKILL after ``timeout_s``; the exit code."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        _close_stdin(process)
        self._process = None
        _launched.discard(self)
        return process.returncode

    def kill(self) -> None:
        """SIGKILL, as a crash would: nothing is saved beyond the checkpoint of the last batch handed out."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait()
        _close_stdin(process)
        self._process = None
        _launched.discard(self)

    def restart(self, *, resume: bool = True) -> "LaunchedEngine":
        """Stop (if running) and start again on the same port and run dir, by default continuing the run (``--resume``)."""
        self.stop()
        return self.start(resume=resume)

    def __enter__(self) -> "LaunchedEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"LaunchedEngine(url={self.url!r}, pid={self.pid}, run_dir={str(self.run_dir)!r})"


def _close_stdin(process: "subprocess.Popen[bytes]") -> None:
    if process.stdin is not None and not process.stdin.closed:
        try:
            process.stdin.close()
        except OSError:  # the engine is gone: the pipe may be broken
            pass


# Held strongly until stopped: an engine the trainer dropped every reference to still runs, and
# must still be stopped at exit.
_launched: "Set[LaunchedEngine]" = set()


@atexit.register
def _stop_all() -> None:
    for engine in list(_launched):
        try:
            engine.stop(timeout_s=10)
        except Exception:  # at exit, one engine that will not stop must not keep the others running
            pass


def launch(
    config: Union[None, PathLike, Mapping[str, Any]] = None,
    *,
    run_dir: Optional[PathLike] = None,
    resume: bool = False,
    host: str = "127.0.0.1",
    token: Optional[str] = None,
    args: Sequence[str] = (),
    command: Optional[Sequence[str]] = None,
    cwd: Optional[PathLike] = None,
    env: Optional[Mapping[str, str]] = None,
    startup_timeout_s: float = 120.0,
) -> LaunchedEngine:
    """Start ``rollout serve`` and wait until it answers.

    ``config`` is a config file's path, or a dict written to ``<run_dir>/launch-config.json`` for it
    (give a dict's paths absolute: they are resolved against the run dir). No config: the engine's embedded
    defaults (the mock inference server, the synthetic environments). ``run_dir`` is where the engine
    keeps its checkpoint, step records and ``serve.log`` (default: a new temporary directory);
    ``resume`` continues the run in it. ``args`` are more ``rollout serve`` flags (``--batch-size``,
    ``--strategy``, ``--threads``, ...). ``token`` defaults to a random one.
    """
    run_path = Path(run_dir) if run_dir is not None else Path(tempfile.mkdtemp(prefix="rollout-serve-"))
    run_path.mkdir(parents=True, exist_ok=True)
    argv = list(command) if command is not None else default_command()
    argv += ["serve", "--host", host, "--run-dir", str(run_path.resolve())]
    if isinstance(config, Mapping):
        # In the run dir, beside the log: one directory holds everything a launch leaves.
        config_path = run_path.resolve() / "launch-config.json"
        config_path.write_text(json.dumps(config))
        argv += ["--config", str(config_path)]
    elif config is not None:
        argv += ["--config", str(Path(config).resolve())]
    argv += list(args)
    secret = token if token is not None else secrets.token_urlsafe(24)
    child_env = dict(os.environ if env is None else env)
    child_env["ROLLOUT_TOKEN"] = secret
    engine = LaunchedEngine(argv, child_env, None if cwd is None else str(cwd), run_path, secret, host, startup_timeout_s)
    return engine.start(resume=resume)


__all__ = ["launch", "LaunchedEngine", "default_command"]
