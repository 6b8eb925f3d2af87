"""A real headless Chromium for the web page tests, driven over the Chrome DevTools protocol
(its websocket, through the `websockets` package): Debian's `chromium`, installed by
ensure_chromium() with apt-get when it is missing (the suite's own set-up; nothing else
downloads), started with a fresh profile, every network extra off."""
from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--remote-debugging-address=127.0.0.1",
         "--remote-debugging-port=0")


def ensure_chromium() -> str | None:
    """The path of Chromium, installing Debian's package when it is missing (about 45 s on a
    2-core host, once); None with the reason when it cannot be had (no apt-get)."""
    if os.access(CHROMIUM, os.X_OK):
        return None
    apt = shutil.which("apt-get")
    if apt is None:
        return "no /usr/bin/chromium and no apt-get to install it (Debian package 'chromium')"
    sudo = [] if os.geteuid() == 0 else (["sudo", "-n"] if shutil.which("sudo") else None)
    if sudo is None:
        return "no /usr/bin/chromium and not root: run `apt-get install -y chromium` as root"
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = [*sudo, apt, "install", "-y", "-q", "--no-install-recommends", "chromium"]
    if subprocess.run(install, env=env, capture_output=True).returncode != 0:
        # a fresh image has no package lists yet
        subprocess.run([*sudo, apt, "update", "-q"], env=env, capture_output=True, check=True)
        subprocess.run(install, env=env, capture_output=True, check=True)
    if not os.access(CHROMIUM, os.X_OK):
        raise RuntimeError("apt-get installed 'chromium' but /usr/bin/chromium is missing")
    return None


class Chromium:
    """`with Chromium() as page: page.navigate(url); page.evaluate("1 + 1")` — one headless
    browser with one page; console errors and exceptions are collected in `errors`."""

    def __init__(self, timeout: float = 20.0):
        self.timeout = timeout
        self.errors: list[str] = []
        self._ids = itertools.count(1)

    def __enter__(self) -> "Chromium":
        from websockets.sync.client import connect
        self._profile = tempfile.TemporaryDirectory(prefix="xdna-chromium-", ignore_cleanup_errors=True)  # chromium may still be writing its profile as it exits
        profile = Path(self._profile.name)
        self.proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}",
                                      "about:blank"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        try:
            port_file = profile / "DevToolsActivePort"
            deadline = time.monotonic() + self.timeout
            while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("chromium did not open its DevTools port "
                                       f"(exit code {self.proc.poll()})")
                time.sleep(0.05)
            port = int(port_file.read_text().split()[0])
            pages = []
            while not pages:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list") as r:
                    pages = [t for t in json.load(r) if t["type"] == "page"]
                if not pages:
                    if time.monotonic() > deadline:
                        raise RuntimeError("chromium opened no page")
                    time.sleep(0.05)
            self.ws = connect(pages[0]["webSocketDebuggerUrl"], max_size=None,
                              open_timeout=self.timeout).__enter__()
            for domain in ("Page", "Runtime", "Log"):
                self.send(f"{domain}.enable")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if getattr(self, "ws", None) is not None:
            self.ws.close()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._profile.cleanup()

    def send(self, method: str, **params) -> dict:
        """One DevTools command; its result (events that arrive meanwhile are checked for
        errors)."""
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=self.timeout))
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self._event(msg)

    def _event(self, msg: dict) -> None:
        method, params = msg.get("method"), msg.get("params", {})
        if method == "Runtime.exceptionThrown":
            self.errors.append(params["exceptionDetails"].get("exception", {})
                               .get("description", params["exceptionDetails"].get("text")))
        elif method == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(" ".join(str(a.get("value", a.get("description")))
                                        for a in params.get("args", [])))
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            self.errors.append(params["entry"]["text"])

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (promises awaited)."""
        r = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                      awaitPromise=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression}: {r['exceptionDetails']}")
        return r["result"].get("value")

    def wait_for(self, expression: str, timeout: float | None = None):
        """Poll a JavaScript expression until it is truthy; its value (a DOM node comes back as
        {}: test `!== null`)."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"still false after {timeout or self.timeout} s: {expression}")
            time.sleep(0.02)

    def navigate(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete' && location.href !== 'about:blank'")

    def click(self, selector: str) -> None:
        """A real left click (mouse pressed and released) at the element's centre."""
        box = self.evaluate(f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
                            f" e.scrollIntoView({{block: 'center'}});"
                            f" const r = e.getBoundingClientRect();"
                            f" return [r.x + r.width / 2, r.y + r.height / 2]; }})()")
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left",
                      clickCount=1)

    def type(self, selector: str, text: str) -> None:
        """Focus an element and insert `text` as typed input (input events fire)."""
        self.evaluate(f"document.querySelector({json.dumps(selector)}).focus()")
        self.send("Input.insertText", text=text)

    def set_files(self, selector: str, paths: list[str]) -> None:
        """Choose files in an <input type=file> as the file dialog would (change fires)."""
        r = self.send("Runtime.evaluate", expression=f"document.querySelector({json.dumps(selector)})")
        self.send("DOM.setFileInputFiles", files=paths, objectId=r["result"]["objectId"])

    def press_enter(self) -> None:
        self.send("Input.dispatchKeyEvent", type="keyDown", key="Enter", code="Enter",
                  windowsVirtualKeyCode=13, text="\r")
        self.send("Input.dispatchKeyEvent", type="keyUp", key="Enter", code="Enter",
                  windowsVirtualKeyCode=13)
