"""%%px without a cluster, and what importing it costs (no IPython until the extension loads)."""
import subprocess
import sys

import pytest

from flowlab.cluster.magic import PxError, px, run_cell


def test_importing_flowlab_and_the_magic_module_does_not_import_ipython():
    code = "import sys, flowlab, flowlab.cluster.magic; print('IPython' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False", out.stderr


def test_px_without_a_cluster_says_how_to_start_one():
    with pytest.raises(PxError, match=r"LocalCluster\(workers=2\)"):
        px("", "print(1)")


def test_run_cell_captures_output_the_last_value_and_errors():
    assert run_cell("x = 2\nprint('x is', x)\nx * 21") == {"stdout": "x is 2\n42\n", "stderr": ""}
    r = run_cell("x + undefined_name")
    assert r["error_line"] == "NameError: name 'undefined_name' is not defined" and "<%%px cell>" in r["error"]
