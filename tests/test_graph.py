"""The graph IR: building, printing, JSON round trip, verifier, reference executor, autodiff."""
import json

import numpy as np
import pytest

from compiler.autodiff import split_joint
from compiler.graph import Graph, GraphError, NodeRef
from compiler.ops import Spec
from compiler.reference import run_reference
from compiler.verify import verify


def mlp_graph():
    g = Graph("mlp")
    x = g.add_input(Spec((2, 4), "float32"), "x")
    w = g.add_param(Spec((3, 4), "float32"), "w")
    b = g.add_param(Spec((3,), "float32"), "b")
    wt = g.add_op("transpose", [NodeRef(w)], {"axes": (1, 0)}, ("model.py", 3))
    y = g.add_op("matmul", [NodeRef(x), NodeRef(wt)], {}, ("model.py", 3))
    y = g.add_op("add", [NodeRef(y), NodeRef(b)], {}, ("model.py", 4))
    y = g.add_op("relu", [NodeRef(y)], {}, ("model.py", 5))
    y = g.add_op("mul", [NodeRef(y), 2.0], {}, ("model.py", 6))
    g.outputs = [y]
    return g


def test_printer_is_typed_and_names_lines():
    text = mlp_graph().format()
    assert "%5:f32[2,3] = add(%4, %2)  # model.py:4" in text
    assert "mul(%6, 2.0)" in text
    assert text.splitlines()[-1].strip() == "return %7"


def test_json_round_trip_is_exact():
    g = mlp_graph()
    g.add_const(np.arange(6, dtype=np.float32).reshape(2, 3), "c")
    g2 = Graph.from_json(g.to_json())
    assert g2.format() == g.format()
    assert g2.to_json() == g.to_json()
    np.testing.assert_array_equal(g2.constants["c"], g.constants["c"])


def test_json_refuses_unknown_op_and_wrong_types_and_version():
    doc = json.loads(mlp_graph().to_json())
    bad = json.loads(json.dumps(doc))
    bad["nodes"][-1]["op"] = "launch_missiles"
    with pytest.raises(GraphError, match="unknown op 'launch_missiles'"):
        Graph.from_json(json.dumps(bad))
    bad = json.loads(json.dumps(doc))
    bad["nodes"][-1]["shape"] = [9, 9]
    with pytest.raises(GraphError, match="recorded as"):
        Graph.from_json(json.dumps(bad))
    bad = dict(doc, schema_version=99)
    with pytest.raises(GraphError, match="schema_version 99"):
        Graph.from_json(json.dumps(bad))
    with pytest.raises(GraphError, match="not valid JSON"):
        Graph.from_json(b"\xff\xfe{")
    with pytest.raises(GraphError):
        Graph.from_json(json.dumps({"schema": "hybrid.graph", "schema_version": 1,
                                    "nodes": "x"}))


def test_verifier_catches_inconsistent_types_and_cycles():
    g = mlp_graph()
    verify(g)
    g.node(g.outputs[0])["spec"] = Spec((2, 3), "float64")
    with pytest.raises(GraphError, match="typed"):
        verify(g)
    g = mlp_graph()
    out = g.outputs[0]
    g.g.add_edge(out, g.inputs[0] + 3, pos=5)
    with pytest.raises(GraphError):
        verify(g)


def test_reference_executor_matches_numpy():
    g = mlp_graph()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    (y,) = run_reference(g, [x], [w, b])
    np.testing.assert_allclose(y, np.maximum(x @ w.T + b, 0) * 2, rtol=1e-6, atol=1e-6)


def test_split_joint_gradients_match_finite_differences():
    g = mlp_graph()
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4))
    w = rng.standard_normal((3, 4))
    b = rng.standard_normal(3) + 0.5
    g64 = Graph.from_json(g.to_json().replace('"float32"', '"float64"'))
    tg = split_joint(g64, g64.inputs + g64.params)
    fwd = run_reference(tg.forward, [x], [w, b])
    res = []
    for r in tg.residuals:
        if tg.forward.op(r) == "input":
            res.append(x)
        elif tg.forward.op(r) == "param":
            res.append({g64.params[0]: w, g64.params[1]: b}[r])
        else:
            res.append(fwd[tg.forward.outputs.index(r)])
    head = rng.standard_normal((2, 3))
    gx, gw, gb = run_reference(tg.backward, res + [head])

    def f(xv, wv, bv):
        return float((run_reference(g64, [xv], [wv, bv])[0] * head).sum())
    for arr, grad in ((x, gx), (w, gw), (b, gb)):
        num = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            d = np.zeros_like(arr)
            d[i] = 1e-6
            num[i] = (f(*[a + d if a is arr else a for a in (x, w, b)])
                      - f(*[a - d if a is arr else a for a in (x, w, b)])) / 2e-6
        np.testing.assert_allclose(grad, num, rtol=1e-5, atol=1e-6)


def test_a_new_constant_never_takes_the_name_of_a_live_one():
    # remove_dead prunes constants; a name built from len(constants) then named a live one
    # and overwrote its value (an LSTM's zero state read another constant's array)
    g = Graph("c")
    x = g.add_input(Spec((2,), "float32"), "x")
    dead = g.add_const(np.zeros(2, "float32"))
    live = g.add_const(np.full(2, 7.0, "float32"))
    g.outputs = [g.add_op("add", [NodeRef(x), NodeRef(live)], {})]
    assert g.remove_dead() == 1 and dead not in g.g
    fresh = g.add_const(np.ones(2, "float32"))
    names = {g.node(n)["attrs"]["name"] for n in (live, fresh)}
    assert len(names) == 2
    np.testing.assert_array_equal(g.constants[g.node(live)["attrs"]["name"]], [7, 7])
