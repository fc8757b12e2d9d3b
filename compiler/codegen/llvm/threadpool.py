"""A process-wide pool of threads for the parallel loops of generated code.

``i32 hybrid_pool_run(void (*task)(ptr ctx, i64 chunk), ptr ctx, i64 nchunks, i64 nthreads)``
runs ``task(ctx, c)`` for every c in [0, nchunks): the caller and up to nthreads - 1 pool
threads claim chunks from one shared counter, so a pool thread that is late (asleep, or its
core busy with another process) only leaves more chunks to the others instead of holding
everyone at a join. Returns 0 and runs nothing when another caller holds the pool (the
parallel driver then starts threads of its own, as before the pool). Programs reach it through
their ``<symbol>.pool`` pointer, which CompiledProgram sets: the pool is compiled once, when
the first threaded program loads.

Why: starting and joining threads costs ~50 us per parallel loop on a 2-core VM, and LeNet's
training step has ~14 such loops. Pool threads poll for the next job (``sched_yield``, which
gives the core away when something else wants it) for ~SPIN_YIELDS rounds, then sleep on a
condition variable; the next caller wakes them.

The job is one 64-bit word, ``state = gen << 32 | n << 16 | next`` (job number, chunk count,
first unclaimed chunk); a thread claims chunk ``next`` by compare-and-swap of the whole word,
so a thread that saw an older job can never take a chunk of a newer one. ``task``, ``ctx`` and
``done`` are written before the word is published and stay put until every chunk is done.
After a fork the child starts over with no pool threads (the pid is checked per call).
"""
from __future__ import annotations

import threading

POOL_VERSION = 1
SYMBOL = "hybrid_pool_run"
MAX_CHUNKS = 0xFFFF  # chunks of one job (16 bits of the state word)
MAX_HELPERS = 63
SPIN_YIELDS = 2000  # polls (sched_yield) before a pool thread sleeps: ~0.5-1 ms
SYNC_BYTES = 128  # room for a pthread mutex or condition variable on any platform we run on

_lock = threading.Lock()
_state: dict = {}


def emit_pool_ir(triple: str, data_layout: str) -> str:
    # imported here: a warm start loads the pool from the disk cache without them
    from llvmlite import ir  # noqa: PLC0415

    from .scalar import I8, I32, I64, PTR, Intrinsics  # noqa: PLC0415
    m = ir.Module(name="hybrid_pool")
    m.triple, m.data_layout = triple, data_layout
    intr = Intrinsics(m)

    def glob(name, ty, align=64, init=None):
        g = ir.GlobalVariable(m, ty, name)
        g.linkage = "internal"
        g.align = align
        g.initializer = init if init is not None else ir.Constant(ty, None)
        return g
    state, done, slots = glob("state", I64), glob("done", I64), glob("slots", I64)
    task_g, ctx_g = glob("task", PTR), glob("ctx", PTR)
    busy, pid_g = glob("busy", I32), glob("pid", I32)
    started, sleepers = glob("started", I64), glob("sleepers", I64)
    mutex = glob("mutex", ir.ArrayType(I8, SYNC_BYTES))
    cond = glob("cond", ir.ArrayType(I8, SYNC_BYTES))

    def ext(name, ret, args):
        return intr.get(name, ret, args, readnone=False)
    sched_yield = ext("sched_yield", I32, [])
    getpid = ext("getpid", I32, [])
    create = ext("pthread_create", I32, [PTR, PTR, PTR, PTR])
    detach = ext("pthread_detach", I32, [I64])
    m_init, c_init = ext("pthread_mutex_init", I32, [PTR, PTR]), ext("pthread_cond_init",
                                                                      I32, [PTR, PTR])
    lock, unlock = ext("pthread_mutex_lock", I32, [PTR]), ext("pthread_mutex_unlock", I32,
                                                               [PTR])
    wait, broadcast = ext("pthread_cond_wait", I32, [PTR, PTR]), ext("pthread_cond_broadcast",
                                                                      I32, [PTR])
    task_ty = ir.FunctionType(ir.VoidType(), [PTR, I64])
    c64 = lambda v: ir.Constant(I64, v)  # noqa: E731
    null = ir.Constant(PTR, None)

    def load(b, g, ty, order="acquire"):
        return b.load_atomic(g, order, ty.width // 8, typ=ty)

    def store(b, v, g, order="monotonic"):
        b.store_atomic(v, g, order, v.type.width // 8)

    # claim(gen): run unclaimed chunks of job gen until none is left
    claim = ir.Function(m, ir.FunctionType(ir.VoidType(), [I64]), "claim")
    claim.linkage = "internal"
    b = ir.IRBuilder(claim.append_basic_block("entry"))
    loop, run, out = (claim.append_basic_block(n) for n in ("loop", "run", "out"))
    b.branch(loop)
    b.position_at_end(loop)
    s = load(b, state, I64)
    same = b.icmp_unsigned("==", b.lshr(s, c64(32)), claim.args[0])
    nxt = b.and_(s, c64(0xFFFF))
    cnt = b.and_(b.lshr(s, c64(16)), c64(0xFFFF))
    open_ = b.and_(same, b.icmp_unsigned("<", nxt, cnt))
    with b.if_then(open_):
        won = b.extract_value(b.cmpxchg(state, s, b.add(s, c64(1)), "acq_rel", "acquire"), 1)
        b.cbranch(won, run, loop)
    b.branch(out)
    b.position_at_end(run)
    b.call(b.load(task_g, typ=task_ty.as_pointer()), [b.load(ctx_g, typ=PTR), nxt])
    b.atomic_rmw("add", done, c64(1), "release")
    b.branch(loop)
    b.position_at_end(out)
    b.ret_void()

    # worker(arg): wait for a new job (poll, then sleep), claim chunks if a slot is left
    worker = ir.Function(m, ir.FunctionType(PTR, [PTR]), "worker")
    worker.linkage = "internal"
    b = ir.IRBuilder(worker.append_basic_block("entry"))
    seen = b.alloca(I64)
    spins = b.alloca(I64)
    b.store(c64(0), seen)
    top, poll, sleep, job = (worker.append_basic_block(n) for n in ("top", "poll", "sleep",
                                                                      "job"))
    b.branch(top)
    b.position_at_end(top)
    b.store(c64(0), spins)
    b.branch(poll)
    b.position_at_end(poll)
    gen = b.lshr(load(b, state, I64), c64(32))
    new = b.icmp_unsigned("!=", gen, b.load(seen, typ=I64))
    with b.if_then(new):
        b.store(gen, seen)
        b.branch(job)
    k = b.add(b.load(spins, typ=I64), c64(1))
    b.store(k, spins)
    with b.if_then(b.icmp_unsigned("<", k, c64(SPIN_YIELDS))):
        b.call(sched_yield, [])
        b.branch(poll)
    b.branch(sleep)
    b.position_at_end(sleep)  # under the mutex: sleep while no new job was published
    b.call(lock, [mutex])
    b.atomic_rmw("add", sleepers, c64(1), "seq_cst")
    chk, nap, woke = (worker.append_basic_block(n) for n in ("check", "nap", "woke"))
    b.branch(chk)
    b.position_at_end(chk)
    g2 = b.lshr(load(b, state, I64, "seq_cst"), c64(32))
    b.cbranch(b.icmp_unsigned("==", g2, b.load(seen, typ=I64)), nap, woke)
    b.position_at_end(nap)
    b.call(wait, [cond, mutex])
    b.branch(chk)
    b.position_at_end(woke)
    b.atomic_rmw("sub", sleepers, c64(1), "seq_cst")
    b.call(unlock, [mutex])
    b.branch(top)
    b.position_at_end(job)
    left = b.atomic_rmw("sub", slots, c64(1), "acq_rel")
    with b.if_then(b.icmp_signed(">", left, c64(0))):
        b.call(claim, [b.load(seen, typ=I64)])
    b.branch(top)

    # hybrid_pool_run(task, ctx, n, nthreads) -> 1 (ran every chunk) | 0 (pool busy)
    fn = ir.Function(m, ir.FunctionType(I32, [PTR, PTR, I64, I64]), SYMBOL)
    task, ctx, n, nt = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    busy_ret = fn.append_basic_block("busy")
    b.position_at_end(busy_ret)
    b.ret(ir.Constant(I32, 0))
    b.position_at_end(fn.entry_basic_block)
    with b.if_then(b.icmp_unsigned(">", n, c64(MAX_CHUNKS))):
        b.branch(busy_ret)
    # a fork leaves the child without pool threads: the first caller there starts over
    pid = b.call(getpid, [])
    old = load(b, pid_g, I32)
    with b.if_then(b.icmp_signed("!=", pid, old)):
        res = b.cmpxchg(pid_g, old, pid, "acq_rel", "acquire")
        with b.if_else(b.extract_value(res, 1)) as (then, otherwise):
            with then:
                store(b, ir.Constant(I32, 0), busy)
                store(b, c64(0), started)
                store(b, c64(0), sleepers)
                b.call(m_init, [mutex, null])
                b.call(c_init, [cond, null])
            with otherwise:
                b.branch(busy_ret)
    got = b.extract_value(b.cmpxchg(busy, ir.Constant(I32, 0), ir.Constant(I32, 1), "acquire",
                                    "monotonic"), 1)
    with b.if_then(b.icmp_unsigned("==", got, ir.Constant(ir.IntType(1), 0))):
        b.branch(busy_ret)
    want = b.select(b.icmp_signed("<", b.sub(nt, c64(1)), c64(MAX_HELPERS)),
                    b.sub(nt, c64(1)), c64(MAX_HELPERS))
    tid = b.alloca(I64)
    grow, make, grown = (fn.append_basic_block(x) for x in ("grow", "make", "grown"))
    b.branch(grow)
    b.position_at_end(grow)
    have = load(b, started, I64, "monotonic")
    b.cbranch(b.icmp_signed("<", have, want), make, grown)
    b.position_at_end(make)
    rc = b.call(create, [tid, null, worker, null])
    with b.if_then(b.icmp_signed("!=", rc, ir.Constant(I32, 0))):
        b.branch(grown)  # no more threads to be had: fewer helpers
    b.call(detach, [b.load(tid, typ=I64)])
    store(b, b.add(have, c64(1)), started)
    b.branch(grow)
    b.position_at_end(grown)
    # the job: its fields first, then the word that opens it (seq_cst: ordered before the
    # sleepers check below, as a sleeping thread orders its count before its state check)
    b.store(task, task_g)
    b.store(ctx, ctx_g)
    store(b, c64(0), done)
    store(b, want, slots)
    gen = b.add(b.lshr(load(b, state, I64, "monotonic"), c64(32)), c64(1))
    store(b, b.or_(b.shl(gen, c64(32)), b.shl(n, c64(16))), state, "seq_cst")
    with b.if_then(b.icmp_signed(">", load(b, sleepers, I64, "seq_cst"), c64(0))):
        b.call(lock, [mutex])
        b.call(broadcast, [cond])
        b.call(unlock, [mutex])
    b.call(claim, [gen])
    spin, wait_more, fin = (fn.append_basic_block(x) for x in ("spin", "more", "fin"))
    b.branch(spin)
    b.position_at_end(spin)  # chunks that pool threads claimed may still be running
    b.cbranch(b.icmp_unsigned("<", load(b, done, I64), n), wait_more, fin)
    b.position_at_end(wait_more)
    b.call(sched_yield, [])
    b.branch(spin)
    b.position_at_end(fin)
    store(b, ir.Constant(I32, 0), busy, "release")
    b.ret(ir.Constant(I32, 1))
    return str(m)


def address() -> int:
    """The pool's entry point, compiled (or loaded from the disk cache) on first use."""
    addr = _state.get("addr")
    if addr is not None:
        return addr
    with _lock:
        if "addr" not in _state:
            from runtime import native  # noqa: PLC0415
            info = native.target_info()
            mod = native.compile_ir(
                lambda: emit_pool_ir(info["triple"], info["data_layout"]), [SYMBOL],
                name="hybrid_pool",
                source_key=f"hybrid_pool/{POOL_VERSION}/{SPIN_YIELDS}/{MAX_HELPERS}/"
                           f"{MAX_CHUNKS}")
            _state["module"] = mod
            _state["addr"] = mod.address(SYMBOL)
        return _state["addr"]


def native_module():
    """The pool's runtime.native module, once loaded (None before)."""
    return _state.get("module")
