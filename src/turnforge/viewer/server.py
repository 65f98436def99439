"""`turnforge view RUN_DIR|episodes.jsonl`: a local web page to browse episodes turn by turn.

    turnforge view runs/qs --port 8080        # then open http://127.0.0.1:8080

The standard library's ThreadingHTTPServer serves one static page (`page.html`, no external assets) and three
JSON routes; the page filters and pages on the server, so a 50 MB file never reaches the browser whole:

    GET /api/sources                         the episode files with their categories and stop reasons
    GET /api/episodes?source=&success=&category=&stop=&q=&offset=&limit=    one page of the filtered list
    GET /api/episode?source=&index=          one episode: messages, turn records, loss mask segments
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from functools import cached_property
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from turnforge.rundir import is_run_dir, read_run
from turnforge.viewer.episodes import EpisodeFile, episode_view, find_episode_files

PAGE_SIZE = 50


class Viewer:
    """The episode files of one target and the tokenizer (if any) that decodes their loss masks."""

    def __init__(self, target: str | Path, tokenizer: str | None = None) -> None:
        self.target = Path(target)
        self.sources: dict[str, EpisodeFile] = find_episode_files(self.target)
        self.tokenizer_path = tokenizer or default_tokenizer(self.target)
        self._lock = threading.Lock()

    @cached_property
    def decode(self) -> Callable[[list[int]], str] | None:
        if self.tokenizer_path is None:
            return None
        from transformers import AutoTokenizer  # seconds to import: only when a token-exact episode is opened

        tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_path)
        return lambda ids: tokenizer.decode(ids)

    def warm(self) -> None:
        """Load the tokenizer now (a few seconds), e.g. in a thread at start, rather than on the first episode."""
        with self._lock:
            _ = self.decode

    def source(self, label: str) -> EpisodeFile:
        if label not in self.sources:
            raise KeyError(f"no episode file {label!r}; files: {', '.join(self.sources)}")
        return self.sources[label]

    def page(self, q: dict[str, str]) -> dict[str, Any]:
        rows = self.source(q.get("source", "")).filtered(
            q.get("success", ""), q.get("category", ""), q.get("stop", ""), q.get("q", "").strip())
        offset, limit = max(0, int(q.get("offset", 0))), min(500, max(1, int(q.get("limit", PAGE_SIZE))))
        items = [{k: v for k, v in vars(r).items() if k not in ("start", "end")} for r in rows[offset : offset + limit]]
        return {"total": len(rows), "offset": offset, "items": items}

    def episode(self, q: dict[str, str]) -> dict[str, Any]:
        traj = self.source(q.get("source", "")).trajectory(int(q.get("index", -1)))
        if traj.prompt_ids:
            self.warm()  # the tokenizer loads once, whichever request comes first
        return episode_view(traj, self.decode if traj.prompt_ids else None)


def default_tokenizer(target: Path) -> str | None:
    """The tokenizer that decodes a run's token ids: its final model's, else the built tiny model's."""
    if is_run_dir(target):
        final = read_run(target).final_model()
        if final is not None and (final[1] / "tokenizer_config.json").exists():
            return str(final[1])
    models = (target if target.is_dir() else target.parent) / "models"
    tiny = [models / "tiny", *sorted(models.glob("tiny-*"))]  # "tiny", else a "tiny:FAMILY" build
    return next((str(path) for path in tiny if (path / "tokenizer_config.json").exists()), None)


def make_server(viewer: Viewer, host: str = "127.0.0.1", port: int = 8080) -> ThreadingHTTPServer:
    """A server for `viewer` bound to host:port (port 0: a free one); call `serve_forever()` on it."""
    page = files("turnforge.viewer").joinpath("page.html").read_bytes()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            url = urlparse(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            try:
                if url.path == "/":
                    return self._send(200, page, "text/html; charset=utf-8")
                if url.path == "/api/sources":
                    body: Any = [s.facets() for s in viewer.sources.values()]
                elif url.path == "/api/episodes":
                    body = viewer.page(q)
                elif url.path == "/api/episode":
                    body = viewer.episode(q)
                else:
                    return self._send(404, b'{"error": "not found"}', "application/json")
            except (KeyError, ValueError, IndexError, OSError) as e:  # OSError: a tokenizer that will not load
                return self._send(400, json.dumps({"error": str(e)}).encode(), "application/json")
            self._send(200, json.dumps(body, ensure_ascii=False).encode(), "application/json")

        def _send(self, status: int, data: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # no line per request on the terminal

    return ThreadingHTTPServer((host, port), Handler)
