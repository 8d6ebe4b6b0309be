"""A JupyterLab server on loopback and a headless Chromium on it, for the browser tests.

The browser is the system's Chromium (Debian's `chromium` package), driven by Playwright for
Python: no browser is downloaded.  Nothing here reaches past localhost.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def jupyterlab(root: Path, timeout: float = 120.0):
    """Start `jupyter lab` serving `root` on a free loopback port; yield its base URL and token."""
    port, token = free_port(), secrets.token_hex(16)
    log = open(root / "jupyterlab.log", "w")
    # Fresh user settings and workspaces: no state from earlier runs, and no news pop-up over the notebook.
    settings = root / ".lab-settings"
    news = settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    news.parent.mkdir(parents=True, exist_ok=True)
    news.write_text('{"fetchNews": "false", "checkForUpdates": false}')
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(settings),
               JUPYTERLAB_WORKSPACES_DIR=str(root / ".lab-workspaces"))
    # the imports a kernel makes, done once here so their bytecode is compiled before it starts
    subprocess.run([sys.executable, "-c", "import torch, IPython, ipykernel, ipywidgets, torchmagic.api"],
                   check=True, timeout=600)
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root", "--ip=127.0.0.1",
         f"--port={port}", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
         "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
         # A fresh venv's first kernel compiles the bytecode of torch and IPython as it imports them:
         # past the default 60 s the server gives up on it, restarts it, and the queued cells are lost.
         "--MappingKernelManager.kernel_info_timeout=600"],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{(root / 'jupyterlab.log').read_text()}")
            try:
                with urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("jupyter lab did not answer within "
                                       f"{timeout:.0f} s:\n{(root / 'jupyterlab.log').read_text()}")
                time.sleep(0.5)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _api(base: str, token: str, path: str, body: dict | None = None) -> dict | list:
    request = urllib.request.Request(
        f"{base}/api/{path}?token={token}", method="POST" if body is not None else "GET",
        data=None if body is None else json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def start_notebook_kernel(base: str, token: str, notebook: str, timeout: float = 600.0) -> str:
    """Start the notebook's session and kernel through the server's REST API and wait until the kernel
    answers; return its id.  JupyterLab then opens the notebook on that kernel: left to start one itself
    while a fresh venv's first kernel is still importing, it can time out, offer "Select Kernel" and
    replace the kernel (shutting the old one down with the cells it had queued: CI, 2026-11-28)."""
    session = _api(base, token, "sessions", {"path": notebook, "name": notebook, "type": "notebook",
                                             "kernel": {"name": "python3"}})
    kernel = session["kernel"]["id"]
    # the kernel's REST state stays "starting" until a client talks to it: ask it for kernel_info directly
    from jupyter_client import BlockingKernelClient
    from jupyter_core.paths import jupyter_runtime_dir

    client = BlockingKernelClient(connection_file=str(Path(jupyter_runtime_dir()) / f"kernel-{kernel}.json"))
    client.load_connection_file()
    # No heartbeat channel: it calls a kernel dead after one second without a beat, which a kernel importing
    # torch on a loaded 2-core machine missed ("Kernel died before replying to kernel_info", 2026-12-02).  The
    # server, which started the kernel, says whether it died.
    client.start_channels(hb=False)
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                client.wait_for_ready(timeout=5)
                return kernel
            except RuntimeError:
                state = _api(base, token, f"kernels/{kernel}").get("execution_state")
                if state == "dead" or time.monotonic() > deadline:
                    raise RuntimeError(f"the notebook's kernel did not answer in {timeout:.0f} s (its state: {state})")
    finally:
        client.stop_channels()


def notebook_kernels(base: str, token: str) -> list[str]:
    """The ids of the kernels the server's sessions hold now."""
    return [s["kernel"]["id"] for s in _api(base, token, "sessions") if s.get("kernel")]


@contextmanager
def chromium_page(executable: str, width: int = 1400, height: int = 1000):
    """A headless Chromium page; yields (page, errors): JavaScript errors and failed requests seen."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=executable, headless=True,
            args=["--no-sandbox", "--disable-background-networking", "--disable-component-update",
                  "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            errors: list[str] = []
            page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
            page.on("response", lambda r: errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
            yield page, errors
        finally:
            browser.close()
