"""A local HTTP server speaking the part of the Hugging Face Hub API that `huggingface_hub`'s
snapshot_download uses (model info with its file list, HEAD/GET of /{repo}/resolve/{rev}/{file}
with Range), for `xdna pull` tests through HF_ENDPOINT. Nothing leaves the machine.

`cut_after`: the first GET of each file is cut after this many bytes (the connection drops, or
with `stall` hangs until `release` is set), so the download must resume; `ranges` records every
Range header received."""
from __future__ import annotations

import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

SHA = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repo: str, folder: Path, cut_after: int | None = None,
                 stall: bool = False):
        self.repo, self.cut_after, self.stall = repo, cut_after, stall
        self.release = threading.Event()        # ends a stall
        self.files = {p.relative_to(folder).as_posix(): p.read_bytes()
                      for p in sorted(folder.rglob("*")) if p.is_file()}
        self.ranges: list[tuple[str, str]] = []
        self.cut: set[str] = set()
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _file(self) -> str | None:
                prefix = f"/{hub.repo}/resolve/"
                if not self.path.startswith(prefix):
                    return None
                rest = self.path[len(prefix):].split("?")[0]
                name = rest.split("/", 1)[1] if "/" in rest else ""
                return name if name in hub.files else None

            def _head(self, name: str, length: int, status: int = 200) -> None:
                data = hub.files[name]
                self.send_response(status)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(length))
                self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
                self.send_header("X-Repo-Commit", SHA)
                self.send_header("Accept-Ranges", "bytes")
                self.end_headers()

            def do_HEAD(self):
                name = self._file()
                if name is None:
                    return self._missing()
                self._head(name, len(hub.files[name]))

            def do_GET(self):
                if self.path.split("?")[0].startswith(f"/api/models/{hub.repo}"):
                    if "/tree/" in self.path:               # the file list (one page)
                        body = json.dumps([{"type": "file", "path": n, "size": len(d),
                                            "oid": hashlib.sha1(d).hexdigest()}
                                           for n, d in hub.files.items()])
                    else:
                        body = json.dumps({"id": hub.repo, "sha": SHA, "private": False,
                                           "siblings": [{"rfilename": n} for n in hub.files]})
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body.encode())
                    return
                name = self._file()
                if name is None:
                    return self._missing()
                data = hub.files[name]
                start = 0
                rng = self.headers.get("Range")
                if rng:
                    hub.ranges.append((name, rng))
                    start = int(rng.split("=")[1].split("-")[0])
                self._head(name, len(data) - start, 206 if rng else 200)
                if hub.cut_after is not None and name not in hub.cut and \
                        len(data) > hub.cut_after:
                    hub.cut.add(name)
                    self.wfile.write(data[:hub.cut_after])
                    self.wfile.flush()
                    time.sleep(0.3)                  # let the client take these bytes in
                    if hub.stall:                    # hang like a dead network until released
                        hub.release.wait(120)
                    self.close_connection = True
                    import socket
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data[start:])

            def _missing(self):
                body = b'{"error": "Repository not found"}'
                self.send_response(404)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-Error-Code", "RepoNotFound")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()
