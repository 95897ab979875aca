"""Graph.to_svg(): a well-formed, self-contained, deterministic drawing, one box per node, one
arrow per input, boxes filled by device with a legend."""
import xml.etree.ElementTree as ET

import pytest

import flowlab as fl
from flowlab.core import graph_svg

NS = {"s": "http://www.w3.org/2000/svg"}


@pytest.fixture
def devices():
    fl.config.set_logical_devices("CPU", 2)
    fl.config.set_logical_devices("GPU", 2)
    yield
    fl.config.set_logical_devices("CPU", None)
    fl.config.set_logical_devices("GPU", None)


def parse(svg):
    root = ET.fromstring(svg)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    return root


def boxes(root):
    return {g.get("id"): g for g in root.iterfind(".//s:g[@class='node']", NS)}


def fill_of(root, index):
    return boxes(root)[f"node-{index}"].find("s:rect", NS).get("fill")


def edges(root):
    return [p for p in root.iterfind(".//s:path", NS) if p.get("class", "").startswith("edge")]


def legend(root):
    g = root.find(".//s:g[@class='legend']", NS)
    return [t.text for t in g.iterfind("s:text", NS)], [r.get("fill") for r in g.iterfind("s:rect", NS)]


def lesson_model():
    """The two-layer model of lessons/03_devices_and_placement.ipynb."""
    fl.random.set_seed(0)
    w1 = fl.Variable(fl.random.normal([4, 8]) * 0.5, name="w1")
    b1 = fl.Variable(fl.zeros([8]), name="b1")
    w2 = fl.Variable(fl.random.normal([8, 3]) * 0.5, name="w2")
    b2 = fl.Variable(fl.zeros([3]), name="b2")

    @fl.function
    def model_loss(x, y):
        with fl.device("/gpu:0"):
            h = fl.nn.relu(x @ w1 + b1)
        with fl.device("/gpu:1"):
            logits = h @ w2 + b2
        with fl.device("/cpu:0"):
            return fl.reduce_mean(fl.nn.sparse_softmax_cross_entropy_with_logits(y, logits))

    x, y = fl.random.normal([16, 4]), fl.constant([0, 1, 2, 0] * 4)
    return model_loss.get_concrete_function(x, y), model_loss(x, y)


def test_one_box_per_node_and_one_arrow_per_input():
    g = fl.Graph("g")
    with g.as_default():
        x = g.placeholder(fl.float32, [3], name="x")
        y = x * x + 1.0          # x used twice by one node: two arrows
        z = fl.reduce_sum(y)
    root = parse(g.to_svg([z]))
    assert sorted(boxes(root)) == sorted(f"node-{n.index}" for n in g.nodes)
    assert len(edges(root)) == sum(len(n.inputs) for n in g.nodes) == 5
    assert all(p.get("marker-end") == "url(#fl-arrow)" for p in edges(root))
    assert root.find(".//s:marker[@id='fl-arrow']", NS) is not None
    texts = ["".join(t.itertext()) for t in root.iterfind(".//s:g[@class='node']/s:text", NS)]
    assert "placeholder x" in texts and "const 1." in texts and "multiply" in texts and "reduce_sum" in texts
    # the returned node has the thick border; every node has a tooltip with its listing line and source
    assert boxes(root)[f"node-{z.node.index}"].find("s:rect", NS).get("stroke-width") == "2.6"
    title = boxes(root)[f"node-{y.node.index}"].find("s:title", NS).text
    assert title.startswith(f"%{y.node.index} = add ") and "source: " in title and "test_graph_svg.py" in title


def test_self_contained_and_sized():
    g = fl.Graph("g")
    with g.as_default():
        fl.exp(g.placeholder(fl.float32, [2], name="x"))
    svg = g.to_svg()
    root = parse(svg)
    for bad in ("<script", "<style", "@import", "http://fonts", "href=\"http", "<foreignObject", "<image"):
        assert bad not in svg
    width, height = float(root.get("width")), float(root.get("height"))
    assert root.get("viewBox") == f"0 0 {root.get('width')} {root.get('height')}" and width > 0 and height > 0


def test_layers_run_top_to_bottom_and_reads_sit_above_their_user():
    g = fl.Graph("g")
    v = fl.Variable([1.0, 2.0], name="v")
    with g.as_default():
        x = g.placeholder(fl.float32, [2], name="x")
        a = fl.exp(x)
        b = fl.exp(a)
        c = b * v                # the read of v is made here: its row is just above c
    root = parse(g.to_svg())

    def y_of(t):
        return float(boxes(root)[f"node-{t.node.index}"].find("s:rect", NS).get("y"))

    read = next(n.output for n in g.nodes if n.op.name == "read")
    assert y_of(x) < y_of(a) < y_of(b) < y_of(c)
    assert y_of(read) == y_of(b)


def test_devices_get_their_own_colours_and_a_legend(devices):
    g = fl.Graph("g")
    with g.as_default():
        x = g.placeholder(fl.float32, [2], name="x")
        with fl.device("/gpu:0"):
            a = fl.exp(x)
        with fl.device("/gpu:1"):
            b = fl.exp(a)
        with fl.device("/cpu:1"):
            c = fl.exp(b)
        with fl.device("/cpu:0"):
            d = fl.exp(c)
    root = parse(g.to_svg())
    colours = [fill_of(root, t.node.index) for t in (x, a, b, c)]
    assert len(set(colours)) == 4, colours
    assert fill_of(root, d.node.index) == fill_of(root, x.node.index) == graph_svg.DEFAULT_FILL
    texts, fills = legend(root)
    assert texts[0] == "devices"
    assert texts[1:5] == ["CPU:0 (default)", "CPU:1", "GPU:0", "GPU:1"]
    assert fills == [graph_svg.DEFAULT_FILL, colours[3], colours[1], colours[2]]
    assert "dashed arrow: crosses devices" in texts
    cross = [p for p in edges(root) if "cross" in p.get("class")]
    assert len(cross) == 4 and all(p.get("stroke-dasharray") for p in cross)


def test_remote_devices_are_named_in_full():
    g = fl.Graph("g")
    with g.as_default():
        x = g.placeholder(fl.float32, [2], name="x")
        with fl.device("/job:worker/task:1/gpu:0"):
            fl.exp(x)
    texts, _ = legend(parse(g.to_svg()))
    assert "/job:worker/replica:0/task:1/device:GPU:0" in texts


def test_text_is_escaped():
    v = fl.Variable([1.0], name="a<b&c")
    g = fl.Graph('x"<&>')
    with g.as_default():
        p = g.placeholder(fl.float32, [1], name="p<'\">&")
        y = p + v
    svg = g.to_svg([y])
    assert "a<b&c" not in svg and "a&lt;b&amp;c" in svg
    root = parse(svg)
    texts = ["".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")]
    assert "read a<b&c" in texts and "placeholder p<'\">&" in texts and "graph x\"<&>" in texts


def test_deterministic():
    def build():
        g = fl.Graph("g")
        with g.as_default():
            x = g.placeholder(fl.float32, [4], name="x")
            y = fl.reduce_sum(fl.exp(x) * 2.0 + fl.sqrt(x * x))
        return g, y

    (g1, y1), (g2, y2) = build(), build()
    assert g1.to_svg([y1]) == g1.to_svg([y1])
    assert g1.to_svg([y1]).replace(g1.nodes[0].source, "") == g2.to_svg([y2]).replace(g2.nodes[0].source, "")


def test_large_graphs_leave_out_constants():
    g = fl.Graph("big")
    with g.as_default():
        t = g.placeholder(fl.float32, [3], name="x")
        for i in range(60):
            t = t * float(i) + 1.0
    assert len(g.nodes) > graph_svg.MAX_NODES
    root = parse(g.to_svg([t]))
    consts = sum(n.op.name == "const" for n in g.nodes)
    assert len(boxes(root)) == len(g.nodes) - consts
    assert len(edges(root)) == sum(1 for n in g.nodes for i in n.inputs if i.node.op.name != "const")
    assert f"({consts} constants not drawn)" in "".join(root.itertext())


def test_the_lesson_function_renders_in_notebooks(devices):
    concrete, loss = lesson_model()
    assert loss.shape == ()
    svg = concrete._repr_svg_()
    assert svg == concrete.graph.to_svg(concrete.outputs)
    root = parse(svg)
    assert len(boxes(root)) == len(concrete.graph.nodes)
    assert len(edges(root)) == sum(len(n.inputs) for n in concrete.graph.nodes)
    texts, _ = legend(root)
    assert {"CPU:0 (default)", "GPU:0", "GPU:1"} <= set(texts)
    assert concrete.graph._repr_svg_() == concrete.graph.to_svg()
    assert repr(concrete.graph).startswith("<fl.Graph")      # the text repr stays
