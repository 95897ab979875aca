"""The %%px cell magic in a real IPython shell, against real worker processes."""
import pytest

from flowlab.cluster.magic import PxError, px

pytestmark = pytest.mark.process
IPython = pytest.importorskip("IPython")


@pytest.fixture(scope="module")
def shell():
    from IPython.core.interactiveshell import InteractiveShell
    sh = InteractiveShell.instance()
    sh.run_line_magic("load_ext", "flowlab.cluster.magic")
    return sh


def test_px_runs_the_cell_on_every_worker_and_labels_each_rank(shell, cluster, capsys):
    shell.run_cell_magic("px", "", "import flowlab as fl\nr = fl.cluster.rank()\nprint('hello from', r)")
    out = capsys.readouterr().out
    assert out == "[worker 0]\nhello from 0\n[worker 1]\nhello from 1\n"


def test_names_persist_between_cells_and_the_last_expression_is_shown(shell, cluster, capsys):
    shell.run_cell_magic("px", "", "total = r * 10")
    shell.run_cell_magic("px", "", "total + 1")
    out = capsys.readouterr().out
    assert out.endswith("[worker 0]\n1\n[worker 1]\n11\n")


def test_a_failure_shows_every_rank_then_names_the_failing_ones(cluster, capsys):
    with pytest.raises(PxError, match=r"\[worker 1\] ZeroDivisionError"):
        px("", "import flowlab as fl\nprint('before')\n1 / (1 - fl.cluster.rank())")
    out = capsys.readouterr().out
    assert "[worker 0]\nbefore\n1.0\n[worker 1]\nbefore\n" in out and "ZeroDivisionError" in out
    assert "<%%px cell>" in out


def test_the_cluster_can_be_named_by_variable_or_target(cluster, capsys):
    px(f"-t {cluster.target}", "print('t')")
    px("--cluster c", "print('c')", user_ns={"c": cluster})
    assert capsys.readouterr().out.count("[worker 1]") == 2
    with pytest.raises(PxError, match="no LocalCluster is held by a variable named 'nope'"):
        px("--cluster nope", "1", user_ns={})
    with pytest.raises(PxError, match="unknown option"):
        px("--bogus", "1")
