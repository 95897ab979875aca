"""What a learner sees in a real Jupyter kernel when flowlab raises: the cell, their own function and
the message, without flowlab's frames; with filtering off (or FLOWLAB_TRACEBACK_FILTERING=0), every
frame; and %tb / %debug still work."""
import os
import re

import pytest

pytestmark = pytest.mark.process
manager = pytest.importorskip("jupyter_client.manager")

ANSI = re.compile(r"\x1b\[[0-9;]*m")
FLOWLAB_DIR = os.path.dirname(__import__("flowlab").__file__)

SETUP = "import flowlab as fl\ndef my_layer(x, w):\n    return fl.matmul(x, w)\n"
FAILING = "y = my_layer(fl.ones([2, 3]), fl.ones([2, 3]))\n"   # inner dimensions 3 and 2 do not match


@pytest.fixture
def kernel(tmp_path):
    made = []

    def start(**env):
        full = {**os.environ, "IPYTHONDIR": str(tmp_path / "ipython"), "MPLCONFIGDIR": str(tmp_path / "mpl"), **env}
        km, kc = manager.start_new_kernel(kernel_name="python3", env=full)
        made.append((km, kc))
        return kc

    yield start
    for km, kc in made:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def run(kc, code, answer=None):
    """Execute ``code`` (``answer``: what to type when it asks for input); (status, the error
    message's content or None, the text printed)."""
    outputs = []
    stdin = {"allow_stdin": True, "stdin_hook": lambda msg: kc.input(answer)} if answer else {}
    reply = kc.execute_interactive(code, timeout=120, output_hook=outputs.append, **stdin)
    errors = [m["content"] for m in outputs if m["msg_type"] == "error"]
    text = "".join(m["content"].get("text", "") for m in outputs if m["msg_type"] == "stream")
    return reply["content"]["status"], (errors[-1] if errors else None), ANSI.sub("", text)


def tb_text(error):
    return ANSI.sub("", "\n".join(error["traceback"]))


def test_a_flowlab_error_shows_the_users_frames_and_message_and_hides_flowlabs(kernel):
    kc = kernel()
    assert run(kc, SETUP)[0] == "ok"
    status, error, _ = run(kc, FAILING)
    assert status == "error" and error["ename"] == "InvalidArgumentError"
    text = tb_text(error)
    assert "my_layer(fl.ones([2, 3]), fl.ones([2, 3]))" in text      # the cell's line
    assert "return fl.matmul(x, w)" in text                           # the user's own function
    assert "inner dimensions do not match" in text                    # the message
    assert FLOWLAB_DIR not in text, text                              # no flowlab frame
    hidden = [line for line in text.splitlines() if "flowlab frame" in line and "hidden" in line]
    assert len(hidden) == 1 and "disable_traceback_filtering()" in hidden[0], text

    # %tb formats the same exception again, filtered; %debug still walks into flowlab's frames
    status, error, _ = run(kc, "%tb")
    assert error is not None and FLOWLAB_DIR not in tb_text(error) and "return fl.matmul(x, w)" in tb_text(error)
    status, _, printed = run(kc, "import sys\nprint(sys.last_traceback is not None and "
                                 "any(f.filename.startswith(fl.__path__[0]) for f in __import__('traceback')"
                                 ".extract_tb(sys.last_value.__traceback__)))")
    assert printed.strip() == "True"     # the exception kept its whole traceback for the debugger
    status, _, printed = run(kc, "%debug", answer="q")                # pdb stops in flowlab's innermost frame
    assert status == "ok" and FLOWLAB_DIR in printed, printed

    # filtering off: flowlab's frames are back
    assert run(kc, "fl.debugging.disable_traceback_filtering()\nprint(fl.debugging.is_traceback_filtering_enabled())")[2].strip() == "False"
    status, error, _ = run(kc, FAILING)
    text = tb_text(error)
    assert os.path.join(FLOWLAB_DIR, "core") in text and "hidden" not in text
    assert "inner dimensions do not match" in text
    run(kc, "fl.debugging.enable_traceback_filtering()")
    assert FLOWLAB_DIR not in tb_text(run(kc, FAILING)[1])


def test_the_environment_variable_turns_filtering_off(kernel):
    kc = kernel(FLOWLAB_TRACEBACK_FILTERING="0")
    run(kc, SETUP)
    status, error, _ = run(kc, FAILING)
    assert status == "error" and os.path.join(FLOWLAB_DIR, "core") in tb_text(error)


def test_errors_without_flowlab_frames_are_left_alone(kernel):
    kc = kernel()
    run(kc, "import flowlab as fl\ndef f():\n    return 1 / 0\n")
    status, error, _ = run(kc, "f()")
    text = tb_text(error)
    assert error["ename"] == "ZeroDivisionError" and "return 1 / 0" in text and "hidden" not in text
