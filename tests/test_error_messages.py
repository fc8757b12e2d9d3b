"""Errors at the edges say what is wrong and how to fix it (issue 24, item 6)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import hybrid as hb
from compiler.graph import Graph, GraphError
from hybrid import nn
from hybrid.tracing import TraceError


def _dense():
    net = nn.Dense(3)
    net.initialize()
    net.hybridize()
    net(hb.ones((2, 4)))
    return net


def test_a_numpy_array_given_to_a_hybridized_block_is_refused_clearly():
    with pytest.raises(TypeError, match=r"NumPy array of shape \(2, 4\).*hb\.array"):
        _dense()(np.ones((2, 4), "float32"))


def test_numpy_data_or_a_list_given_to_a_loaded_model_is_refused_clearly(tmp_path):
    net = _dense()
    net.export(str(tmp_path / "m"), example_inputs=(hb.ones((2, 4)),))
    model = hb.load(str(tmp_path / "m"))
    with pytest.raises(TypeError, match="hb.array"):
        model(np.ones((2, 4), "float32"))
    with pytest.raises(TypeError, match=r"takes 1 hybrid array.*got list.*hb\.array"):
        model([[1.0] * 4])


def test_a_value_leaked_out_of_a_trace_says_so_outside_the_trace():
    kept = []

    class Leak(nn.HybridBlock):
        def forward(self, x):
            kept.append(x * 2)
            return x + 1

    block = Leak()
    block.hybridize()
    block(hb.ones((2,)))
    for use in (lambda v: v.asnumpy(), lambda v: v + 1, lambda v: f"{v:.1f}"):
        with pytest.raises(TraceError, match="leaked out of a hybridized forward"):
            use(kept[0])


def _graph_doc():
    @hb.hybridize
    def f(x):
        return hb.clip(x, float("-inf"), 1.0) * 2

    f(hb.ones((2,)))
    return json.loads(next(iter(f.cache.entries.values())).graph.to_json())


def test_a_graph_whose_outputs_name_a_missing_node_is_refused_clearly():
    doc = _graph_doc()
    doc["outputs"] = [99]
    with pytest.raises(GraphError, match="'outputs' names node 99, which is not a node"):
        Graph.from_json(json.dumps(doc))


def test_a_bad_attribute_tag_is_refused_clearly():
    doc = _graph_doc()
    text = json.dumps(doc)
    assert '"__float__": "-inf"' in text  # clip's a_min
    with pytest.raises(GraphError, match="__float__ holds 'minus infinity'"):
        Graph.from_json(text.replace('"__float__": "-inf"', '"__float__": "minus infinity"'))
    doc["nodes"][-1]["id"] = "seven"
    with pytest.raises(GraphError, match=r"node 'seven' \('mul'\) is malformed"):
        Graph.from_json(json.dumps(doc))


def test_a_misspelt_hybridize_flag_is_refused_with_the_known_ones():
    with pytest.raises(TypeError, match="unknown flag.*static_aloc.*static_alloc"):
        nn.Dense(3).hybridize(static_aloc=True)
    with pytest.raises(TypeError, match="unknown flag.*static_aloc"):
        nn.Sequential().hybridize(static_aloc=True)
    with pytest.raises(TypeError, match="unknown flag.*bakend"):
        hb.hybridize(lambda x: x, bakend="llvm")
    nn.Dense(3).hybridize(static_alloc=True, static_shape=True, inline_limit=2)  # MXNet's


def test_format_specs_work_on_0d_arrays_as_in_numpy():
    assert f"{hb.array(3.1):.2f}" == "3.10"
    assert f"{hb.array([1.0, 2.0])}" == str(np.array([1.0, 2.0], "float32"))
    with pytest.raises(TypeError):
        f"{hb.array([3.1, 2.0]):.2f}"
