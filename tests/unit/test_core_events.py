"""The event log lives in core, below all that record into it; flowlab.cluster.events is the
cluster's name for it, and the cluster gives ``EventLog.export_trace`` its Chrome trace writer."""
import json
import subprocess
import sys

import flowlab.cluster.events as cluster_events
import flowlab.core.events as core_events


def test_the_cluster_view_is_the_same_log():
    for name in cluster_events.__all__:
        assert getattr(cluster_events, name) is getattr(core_events, name), name
    assert cluster_events.default_log() is core_events.default_log()


def test_export_trace_writes_once_the_cluster_is_imported(tmp_path):
    log = core_events.EventLog(task="/job:worker/task:0", rank=0)
    log.record("op", "matmul", 1.0, 2.0)
    log.export_trace(tmp_path / "t.json")
    trace = json.loads((tmp_path / "t.json").read_text())
    assert any(e.get("name") == "matmul" for e in trace["traceEvents"])


def test_a_pipeline_records_without_the_cluster_and_export_trace_says_what_it_needs(tmp_path):
    code = ("import sys, flowlab as fl\n"
            "list(fl.data.Dataset.range(3).map(lambda x: x))\n"
            "from flowlab.core.events import default_log\n"
            "assert default_log().events(kind='produce'), 'no pipeline events'\n"
            "assert not [m for m in sys.modules if m.startswith('flowlab.cluster')], 'the cluster was imported'\n"
            "try:\n    default_log().export_trace('never.json')\nexcept RuntimeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "import flowlab.cluster" in out.stdout
