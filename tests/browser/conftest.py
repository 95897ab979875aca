"""Browser tier: one JupyterLab server per session, a fresh Chromium page per test.

The server's root is a temporary copy of the lessons with their outputs and execution counts
removed, so whatever the page shows comes from this run. FLOWLAB_LESSONS_DIR points the tier at
another folder of notebooks; FLOWLAB_CHROMIUM at another Chromium binary.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
LESSONS_DIR = Path(os.environ.get("FLOWLAB_LESSONS_DIR", REPO / "lessons")).resolve()
CHROMIUM = os.environ.get("FLOWLAB_CHROMIUM", "/usr/bin/chromium")
# NOTE: Debian's Chromium calls Google services despite the --disable-* flags; the resolver rule
# keeps it on loopback.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1, EXCLUDE localhost"]
TOKEN = "flowlab-test"
LAB_SETTINGS = {
    # The "official Jupyter news?" toast would cover the notebook.
    "apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    # Every cell in the DOM, so that off-screen outputs can be counted.
    "notebook-extension/tracker": {"windowingMode": "none"},
}


def pytest_generate_tests(metafunc):
    if "lesson" not in metafunc.fixturenames:
        return
    lessons = [pytest.param(path, id=path.stem) for path in sorted(LESSONS_DIR.glob("*.ipynb"))]
    no_lessons = pytest.param(None, id="no-lessons", marks=pytest.mark.skip(
        reason=f"no lesson notebooks (*.ipynb) in {LESSONS_DIR}"))
    metafunc.parametrize("lesson", lessons or [no_lessons])


@dataclass
class Lab:
    base: str
    pid: int

    def tree_url(self, name):
        return f"{self.base}/lab/tree/{urllib.parse.quote(name)}?token={TOKEN}&reset"

    def processes(self):
        """Everything the server has started and is still running: kernels and their workers."""
        return psutil.Process(self.pid).children(recursive=True)

    def survivors(self, procs, timeout=10):
        """Wait for procs to exit; kill the ones that do not and return {pid: command line}."""
        return _kill_survivors(procs, timeout)


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    home, root = tmp_path_factory.mktemp("jhome"), tmp_path_factory.mktemp("lessons")
    _copy_without_outputs(LESSONS_DIR, root)
    for name, settings in LAB_SETTINGS.items():
        path = home / "settings/@jupyterlab" / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(settings))
    # JUPYTER_DATA_DIR too: a user-level "python3" kernelspec must not replace this venv's.
    env = dict(os.environ, JUPYTER_CONFIG_DIR=f"{home}/cfg", JUPYTER_DATA_DIR=f"{home}/data",
               JUPYTER_RUNTIME_DIR=f"{home}/rt", JUPYTERLAB_SETTINGS_DIR=f"{home}/settings",
               JUPYTERLAB_WORKSPACES_DIR=f"{home}/ws")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    log = home / "lab.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ServerApp.ip=127.0.0.1",
             f"--ServerApp.port={port}", f"--IdentityProvider.token={TOKEN}",
             f"--ServerApp.root_dir={root}", "--ServerApp.allow_root=True",
             "--LabApp.news_url=None", "--LabApp.extension_manager=readonly"],
            env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_until_serving(f"{base}/api/status?token={TOKEN}", server, log)
        yield Lab(base, server.pid)
    finally:
        _stop_server(server)


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=60_000)  # the 5 s default is too short for a cold kernel
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


@pytest.fixture
def page(browser):
    # Lab scrolls inside its own panels, so a tall viewport is what makes a tall screenshot.
    context = browser.new_context(viewport={"width": 1280, "height": 2400})
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    try:
        yield page
    finally:
        context.close()


def _copy_without_outputs(src, dst):
    if src.is_dir():
        shutil.copytree(src, dst, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    for path in dst.glob("*.ipynb"):
        nb = json.loads(path.read_text())  # NOTE: not nbformat, whose import costs 3-6 s here
        for cell in nb["cells"]:
            if cell["cell_type"] == "code":
                cell["outputs"], cell["execution_count"] = [], None
        nb["metadata"].pop("widgets", None)
        path.write_text(json.dumps(nb, indent=1))


def _wait_until_serving(url, server, log, timeout=60):
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return
        except OSError:
            if server.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"JupyterLab did not start:\n{log.read_text()}")
            time.sleep(0.25)


def _stop_server(server):
    """SIGTERM (the server then shuts its kernels down), kill as a fallback, then check that
    neither the server nor anything it started (kernels, their workers) is left."""
    try:
        started = psutil.Process(server.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        started = []
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(10)
    left = _kill_survivors(started, timeout=10)
    assert not psutil.pid_exists(server.pid), f"JupyterLab server {server.pid} is still running"
    assert not left, f"still running after JupyterLab stopped (now killed): {left}"


def _kill_survivors(procs, timeout):
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    left = {}
    for proc in alive:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:  # exited, not yet reaped by PID 1
                left[proc.pid] = " ".join(proc.cmdline())
                proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)
    return left
