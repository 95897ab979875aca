"""The placement graph (flowlab/widgets/placement.py): a layered layout computed in Python, bytes on
the edges that cross devices, name scopes that fold, hover text with the user's own source line, a
JSON-safe snapshot that the widget draws, and the widget's actions over a recording comm."""
import inspect
import json
import xml.etree.ElementTree as ET

import pytest

import flowlab as fl
import flowlab.compat.v1 as tf
from flowlab.widgets import placement
from flowlab.widgets.placement import PlacementGraph

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def devices():
    fl.config.set_logical_devices("GPU", 2)
    yield
    fl.config.set_logical_devices("GPU", 0)


def two_layer_model():
    w1, w2 = fl.Variable(fl.ones([4, 8]), name="w1"), fl.Variable(fl.ones([8, 3]), name="w2")

    @fl.function
    def model(x):
        with fl.device("/gpu:0"):
            h = fl.nn.relu(x @ w1)
        with fl.device("/gpu:1"):
            return h @ w2
    return model


def by_name(snap):
    return {n["name"]: n for n in snap["nodes"] if n["kind"] == "node"}


def test_layers_follow_the_longest_path_and_boxes_never_overlap():
    g = fl.Graph("chain")
    with g.as_default():
        x = g.placeholder(fl.float32, [3], name="x")
        a = fl.exp(x)
        b = fl.sin(a)
        c = a + b                       # longest path x -> exp -> sin -> add: row 3
    snap = placement.placement_graph(g).snapshot()
    rows = {n["name"]: n["row"] for n in snap["nodes"]}
    assert (rows["x"], rows["exp"], rows["sin"], rows[c.node.name]) == (0, 1, 2, 3)
    assert [n["y"] for n in sorted(snap["nodes"], key=lambda n: n["row"])] == sorted(n["y"] for n in snap["nodes"])
    by_row = {}
    for n in snap["nodes"]:
        by_row.setdefault(n["row"], []).append((n["x"], n["x"] + n["w"]))
    for boxes in by_row.values():
        boxes.sort()
        assert all(r1 <= l2 for (_, r1), (l2, _) in zip(boxes, boxes[1:]))


def test_a_variable_read_sits_just_above_its_user(devices):
    snap = placement.placement_graph(two_layer_model(), fl.ones([16, 4])).snapshot()
    nodes = by_name(snap)
    second = next(n for n in snap["nodes"] if n.get("op") == "matmul" and n["device"].endswith("GPU:1"))
    assert nodes["w2"]["row"] == second["row"] - 1


def test_cross_device_edges_carry_the_bytes_they_move(devices):
    pg = placement.placement_graph(two_layer_model(), fl.ones([16, 4]))
    snap = pg.snapshot()
    cross = {(e["from"], e["to"]): e["label"] for e in snap["edges"] if e["cross"]}
    nodes = {n["id"]: n for n in snap["nodes"]}
    labelled = {(nodes[a]["name"], nodes[b]["op"], nodes[b]["device"][-5:]): lab for (a, b), lab in cross.items()}
    # x (float32[16,4], CPU:0) -> matmul on GPU:0: 256 B; relu (float32[16,8]) -> matmul on GPU:1: 512 B
    assert labelled == {("x" if "x" in by_name(snap) else "arg0", "matmul", "GPU:0"): "256 B",
                        ("relu", "matmul", "GPU:1"): "512 B"}
    assert all(e["label"] == "" for e in snap["edges"] if not e["cross"])
    assert "2 cross-device edge(s) moving 768 B" in repr(pg)
    assert "512 B" in pg.to_svg()


def test_an_unknown_dimension_moves_question_mark_bytes(devices):
    g = fl.Graph("unknown")
    with g.as_default():
        x = g.placeholder(fl.float32, [None, 4], name="x")
        with fl.device("/gpu:0"):
            fl.reduce_sum(x * 2.0)
    snap = placement.placement_graph(g).snapshot()
    assert [e["label"] for e in snap["edges"] if e["cross"]] == ["?"]


def test_hover_names_op_shapes_device_and_the_source_line_that_made_the_node(devices):
    g = fl.Graph("hover")
    with g.as_default():
        x = g.placeholder(fl.float32, [2, 3], name="x")
        with fl.device("/gpu:1"):
            y = fl.transpose(x); line = inspect.currentframe().f_lineno    # noqa: E702
    node = by_name(placement.placement_graph(g).snapshot())[y.node.name]
    assert node["source"].startswith(f"{__file__}:{line}:")
    hover = node["hover"].splitlines()
    assert hover[0] == f"transpose  {y.node.name}"
    assert "in 0: float32[2,3]  from x (placeholder)" in hover
    assert "out: float32[3,2]" in hover
    assert "device: /job:localhost/replica:0/task:0/device:GPU:1" in hover
    assert hover[-1] == f"source: {node['source']}"
    assert node["inputs"] == [{"id": "n0", "name": "x", "op": "placeholder", "spec": "float32[2,3]",
                               "device": "CPU:0", "bytes": "24 B"}]


def scoped_graph(layers=8, per_layer=8):
    g = fl.Graph("deep")
    with g.as_default():
        h = g.placeholder(fl.float32, [2, 2], name="x")
        for i in range(layers):
            with g.name_scope(f"layer{i}"), fl.device(f"/job:worker/task:{i % 2}"):
                for _ in range(per_layer // 2):
                    h = fl.tanh(h) + 1.0
    return g, h


def test_large_graphs_fold_by_name_scope_and_unfold_on_request():
    g, out = scoped_graph()
    assert len(g.nodes) > placement.FOLD_AT
    pg = PlacementGraph(g, [out])
    snap = pg.snapshot()
    scopes = [n for n in snap["nodes"] if n["kind"] == "scope"]
    assert [s["scope"] for s in scopes] == [f"layer{i}/" for i in range(8)] == pg.folded
    assert sum(s["count"] for s in scopes) == len(g.nodes) - 1       # all but the input x
    assert scopes[-1]["returned"] and "click to unfold" in scopes[0]["hover"]
    # a copy into the first scope and between tasks at every scope boundary (float32[2,2])
    assert [e["label"] for e in snap["edges"] if e["cross"]] == ["16 B"] * 8
    assert snap["multi_task"] and {s["stripe"] for s in scopes} == set(placement.TASK_COLOURS[1:3])   # task 0 of localhost: the first
    pg.unfold("layer3")
    snap = pg.snapshot()
    assert "layer3/" not in snap["folded"] and len(snap["folded"]) == 7
    inside = [n.name for n in g.nodes if n.name.startswith("layer3/")]
    assert [n["name"] for n in snap["nodes"] if n["kind"] == "node"] == ["x"] + inside
    pg.unfold()
    assert pg.folded == [] and len(pg.snapshot()["nodes"]) == len(g.nodes)
    pg.fold("layer1/")
    assert pg.folded == ["layer1/"]
    with pytest.raises(ValueError, match="no name scope 'layr1/'; did you mean 'layer1/'"):
        pg.fold("layr1")


def test_small_graphs_are_not_folded():
    g, _ = scoped_graph(layers=2, per_layer=4)
    assert PlacementGraph(g).folded == []


def test_the_static_picture_is_deterministic_and_draws_every_box_and_arrow(devices):
    svgs = []
    for _ in range(2):
        pg = placement.placement_graph(two_layer_model(), fl.ones([16, 4]))
        svgs.append(pg.to_svg())
    strip = [s.replace(__file__, "") for s in svgs]
    assert strip[0] == strip[1]
    root = ET.fromstring(svgs[0])
    snap = pg.snapshot()
    groups = [g for g in root.iter(f"{SVG}g") if "fl-pg-node" in g.get("class", "")]
    assert len(groups) == len(snap["nodes"]) == len(pg.graph.nodes)
    edges = [p for p in root.iter(f"{SVG}path") if "fl-pg-edge" in p.get("class", "")]
    assert [p.get("d") for p in edges] == [e["path"] for e in snap["edges"]]
    assert len(edges) == sum(len(n.inputs) for n in pg.graph.nodes)
    json.dumps(snap)                                         # what the widget gets is JSON


def test_a_concrete_function_and_a_v1_graph_show_it(devices):
    model = two_layer_model()
    concrete = model.get_concrete_function(fl.ones([16, 4]))
    assert repr(concrete) == f"<ConcreteFunction model: {len(concrete.graph.nodes)} nodes>"
    assert concrete._repr_html_() == fl.debugging.placement_graph(concrete).to_svg()
    assert concrete._repr_mimebundle_() is None          # outside a kernel: IPython uses the HTML
    g = tf.Graph()
    with g.as_default():
        with tf.device("/job:worker/task:1"):
            tf.placeholder(tf.float32, [3], name="a") * 2.0
    assert g._repr_html_().startswith("<svg") and "/job:worker/replica:0/task:1" in g._repr_html_()


def test_what_placement_graph_takes():
    with pytest.raises(TypeError, match="not function .*decorate the function with @fl.function"):
        fl.debugging.placement_graph(lambda x: x)
    with pytest.raises(TypeError, match="a ConcreteFunction is already traced"):
        f = fl.function(lambda x: x + 1.0)
        fl.debugging.placement_graph(f.get_concrete_function(fl.ones([2])), 3)


def test_node_lists_inputs_and_consumers():
    g = fl.Graph("lists")
    with g.as_default():
        x = g.placeholder(fl.float32, [2], name="x")
        y = fl.exp(x)
        z = y * y
    info = PlacementGraph(g).node("exp")
    assert [i["name"] for i in info["inputs"]] == ["x"]
    assert [c["name"] for c in info["consumers"]] == [z.node.name]
    with pytest.raises(KeyError, match="did you mean 'exp'"):
        PlacementGraph(g).node("exq")


def test_the_view_unfolds_inspects_and_keeps_the_functions_repr(widget_comm, devices):
    pytest.importorskip("anywidget")
    from flowlab.widgets.placement_view import PlacementView
    from _widgets import click

    g, _ = scoped_graph()
    view = PlacementView(PlacementGraph(g))
    assert len(view.snapshot["folded"]) == 8
    reply = click(view, "unfold", scope="layer0/")
    assert reply["ok"] and "layer0/" not in reply["result"]
    assert "layer0/" not in view.comm.updates("snapshot")[-1]["folded"]
    reply = click(view, "inspect", node="x")
    assert reply["ok"] and reply["result"]["consumers"][0]["name"].startswith("layer0/")
    assert view.selected == "x"
    assert "no name scope" in click(view, "fold", scope="nope")["error"]

    concrete = two_layer_model().get_concrete_function(fl.ones([16, 4]))
    view = PlacementView(concrete)
    data, _ = view._repr_mimebundle_()
    assert data["text/plain"] == repr(concrete)
    assert data["text/html"] == concrete._repr_html_()
    assert "application/vnd.jupyter.widget-view+json" in data
