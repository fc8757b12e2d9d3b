"""pack: a loop body's product with a captured matrix reads it panel by panel, in order.

A recurrent layer multiplies a few rows (a state) by the same captured weight at every step:
``h @ B`` with B (K, N) stored row-major. The register-tiled GEMM reads B in panels of
``panel`` columns (extern_plan.panel_cols(): two vector registers): a panel is K pieces of
``panel`` floats, one per row of B, each N floats from the last — on the LSTM's
256 x 1024 recurrent weight, 256 cache lines 4 KiB apart, a page each, which the hardware
prefetcher does not follow. Outside a loop a GEMM copies a transposed B's panels into its
scratch at each call; in a loop, the same copy would be made at every step.

This pass makes the copy once, before the loop: ``Bp = transpose(reshape(B, (K, N/panel,
panel)), (1, 0, 2))`` holds each panel as one contiguous (K, panel) block, and the body
computes ``reshape(transpose(matmul(h, Bp), (1, 0, 2)), (M, N))`` — a batched product whose
every batch is one panel read front to back. Every output element is the same sum over k in
the same order (a panel's GEMM is the GEMM's panel): results are bit for bit the same.
Measured on the LSTM language model's loops (35 steps, batch 32, 2-vCPU AMD EPYC): see
README, issue 22.

The packed operand is appended to the loop's captured operands; nothing else moves, so a
training forward loop, whose ``vjp`` refers to the body's inputs and outputs by position,
is rewritten too. Only on CPU loops (the LLVM backend's GEMM; the CUDA backend tiles its
products in shared memory) and for float32 products with a thin left operand (at most
MAX_ROWS rows: a state, not a whole sequence) and N a multiple of two panels or more.
Pure: returns a new graph; the input graph is not changed.
"""
from __future__ import annotations

from ..graph import Graph, NodeRef
from ..ops.control import Body

MAX_ROWS = 256  # rows of the left operand: a state's batch (larger products pack per call)


def pack_loop_products(graph: Graph, panel: int):
    """Returns (graph, report): every CPU foreach whose body multiplies a thin operand by a
    captured float32 matrix of N = a multiple of ``panel`` columns reads it packed."""
    loops = [n for n in graph.topo_order() if graph.op(n) == "foreach"
             and str(graph.node(n)["device"]).startswith("cpu")]
    if not loops or panel < 1:
        return graph, {"summary": "no loop", "packed": 0}
    out = graph.copy()
    packed = sum(_pack(out, n, panel) for n in loops)
    if not packed:
        return graph, {"summary": "no product to pack", "packed": 0}
    return out, {"summary": f"{packed} loop product(s) read a packed operand", "packed": packed}


def _packable(body: Graph, m, captured: set, panel: int) -> bool:
    if body.op(m) != "matmul":
        return False
    a, b = body.arg_ids(m)
    sa, sb = body.spec(a), body.spec(b)
    return b in captured and a not in captured and sb.dtype == sa.dtype == "float32" and \
        len(sa.shape) == 2 and len(sb.shape) == 2 and 1 <= sa.shape[0] <= MAX_ROWS and \
        sb.shape[1] % panel == 0 and sb.shape[1] >= 2 * panel


def _pack(graph: Graph, n, panel: int) -> int:
    d = graph.node(n)
    attrs = d["attrs"]
    body: Graph = attrs["body"].graph
    counted = 1 if attrs.get("counted") else 0
    n_variant = attrs["n_data"] + attrs["n_states"]
    args = graph.arg_ids(n)
    operand = dict(zip(body.inputs[n_variant:], args[counted + n_variant:]))
    products = [m for m in body.topo_order() if _packable(body, m, set(operand), panel)]
    if not products:
        return 0
    new_body = body.copy()
    device = d["device"]
    packed_inputs: dict = {}  # captured input of the body -> its packed input
    new_operands = []
    for m in products:
        a, b = body.arg_ids(m)
        k, cols = body.spec(b).shape
        if b not in packed_inputs:  # B packed once, before the loop
            split = graph.add_op("reshape", [NodeRef(operand[b])],
                                 {"shape": (k, cols // panel, panel)}, device=device)
            new_operands.append(graph.add_op("transpose", [NodeRef(split)],
                                             {"axes": (1, 0, 2)}, device=device))
            packed_inputs[b] = new_body.add_input(graph.spec(new_operands[-1]),
                                                  f"packed{len(packed_inputs)}",
                                                  new_body.node(b)["device"])
        where, dev = body.node(m).get("where"), body.node(m)["device"]
        rows = body.spec(a).shape[0]
        prod = new_body.add_op("matmul", [NodeRef(a), NodeRef(packed_inputs[b])], {},
                               where, dev)
        back = new_body.add_op("transpose", [NodeRef(prod)], {"axes": (1, 0, 2)}, where, dev)
        flat = new_body.add_op("reshape", [NodeRef(back)], {"shape": (rows, cols)}, where,
                               dev)
        new_body.replace_uses(m, flat)
    new_body.remove_dead()
    graph.replace_control_node(n, args + new_operands, dict(attrs, body=Body(new_body)))
    return len(products)
