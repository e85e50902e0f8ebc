"""Shared by the tests: launching the engine from this repository, and a TCP proxy that loses replies.

The engine is run from the clone's source (``node --import tsx src/cli/main.ts``, what a clone has after
``npm ci``) unless ``$ROLLOUT_COMMAND`` names another command; ``$NODE`` picks the node binary.
"""
from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Any, List, Mapping, Optional, Sequence, Union

import rollout_engine
from rollout_engine import LaunchedEngine

# $ROLLOUT_REPO when the tests run from a copy (test/python/python-client.test.ts runs them beside an
# installed package, away from the source tree, so that the installed one is what they import).
REPO = Path(os.environ.get("ROLLOUT_REPO") or Path(__file__).resolve().parents[2])
MAIN = REPO / "src" / "cli" / "main.ts"


def engine_command() -> Optional[List[str]]:
    """None (the package's own default: $ROLLOUT_COMMAND) when set, else the CLI from this clone's source."""
    if os.environ.get("ROLLOUT_COMMAND"):
        return None
    return [os.environ.get("NODE", "node"), "--import", "tsx", str(MAIN)]


def launch(config: Union[None, Mapping[str, Any]] = None, *, args: Sequence[str] = (), run_dir: Optional[str] = None, resume: bool = False) -> LaunchedEngine:
    return rollout_engine.launch(
        config,
        command=engine_command(),
        cwd=REPO,  # `--import tsx` resolves tsx from the working directory
        args=list(args),
        run_dir=run_dir,
        resume=resume,
        env={**os.environ, "LOG_LEVEL": os.environ.get("LOG_LEVEL", "info")},
        startup_timeout_s=120,
    )


class ReplyCuttingProxy:
    """A loopback TCP proxy to ``upstream``; :meth:`cut_next_reply` makes it close the connection after
    forwarding the first ``after_bytes`` bytes of the next reply: the request reached the server, its
    answer is lost half-way — what a trainer sees when a connection drops mid-batch."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        self._cut_after: Optional[int] = None
        self.cuts = 0
        self.requests: List[bytes] = []  # the first line of every request forwarded
        self._sockets: List[socket.socket] = []
        self._closed = False
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def cut_next_reply(self, after_bytes: int) -> None:
        with self._lock:
            self._cut_after = after_bytes

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pipe_requests, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pipe_replies, args=(upstream, client), daemon=True).start()

    def _pipe_requests(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                if chunk[:5] in (b"GET /", b"POST "):
                    with self._lock:
                        self.requests.append(chunk.split(b"\r\n", 1)[0])
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            _close(src, dst)

    def _pipe_replies(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                with self._lock:
                    cut, self._cut_after = self._cut_after, None
                if cut is not None:
                    dst.sendall(chunk[:cut])
                    self.cuts += 1
                    break
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            _close(src, dst)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            _close(*self._sockets)


def _close(*sockets: socket.socket) -> None:
    for s in sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
