"""The thread pool's LLVM IR (threadpool.py): generated only when the pool is compiled, so
a warm start, which loads the pool from the disk cache, neither compiles this module's
source nor imports llvmlite.ir."""
from __future__ import annotations

from llvmlite import ir

from .scalar import I8, I32, I64, PTR, Intrinsics
from .threadpool import MAX_CHUNKS, MAX_HELPERS, SPIN_YIELDS, SYMBOL, SYNC_BYTES  # noqa: F401


def emit_pool_ir(triple: str, data_layout: str) -> str:
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
