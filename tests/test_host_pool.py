"""The host pool that recycles compiled calls' large outputs (runtime/memory.py): a block is
reused only when nothing refers to it, never while an array or a view of it is alive."""
import threading

import numpy as np

import hybrid as hb
from hybrid import nn
from runtime import config
from runtime.memory import HostPool, host_pool


def test_free_block_is_reused_and_aligned():
    pool = HostPool(1 << 30)
    a, addr = pool.empty((100, 100), np.float32, 40000)
    assert addr % 64 == 0 and a.shape == (100, 100) and a.flags.c_contiguous
    del a
    b, addr2 = pool.empty((200, 50), np.float32, 40000)
    assert addr2 == addr and b.shape == (200, 50)


def test_live_array_or_view_is_never_reused():
    pool = HostPool(1 << 30)
    a, addr = pool.empty((1000,), np.float64, 8000)
    view = a[10:20]
    del a
    b, addr_b = pool.empty((1000,), np.float64, 8000)
    assert addr_b != addr
    b[:] = 1.0
    view[:] = 7.0  # the view's block is still its own
    assert (b == 1.0).all()
    del view
    c, addr_c = pool.empty((1000,), np.float64, 8000)
    assert addr_c == addr


def test_limit_and_per_size_cap_bound_what_is_held():
    pool = HostPool(3 * (8000 + HostPool.ALIGN))
    live = [pool.empty((1000,), np.float64, 8000)[0] for _ in range(5)]
    assert pool.held == 3 * (8000 + HostPool.ALIGN)  # the rest are plain fresh arrays
    small = HostPool(1 << 30)
    many = [small.empty((10,), np.float64, 80)[0] for _ in range(HostPool.PER_SIZE + 4)]
    assert len(small.blocks[80]) == HostPool.PER_SIZE
    del live, many
    assert pool.release() == pool.held + 3 * (8000 + HostPool.ALIGN) and pool.held == 0


def test_threads_never_share_a_block():
    pool = HostPool(1 << 30)
    seen, lock = [], threading.Lock()

    def take():
        mine = [pool.empty((256,), np.float32, 1024) for _ in range(50)]
        with lock:
            seen.extend(mine)  # all kept alive until every thread is done
    threads = [threading.Thread(target=take) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    addrs = [addr for _, addr in seen]
    assert len(set(addrs)) == len(addrs)  # every live array got its own block


def test_hybridized_outputs_held_by_the_user_stay_intact():
    """A compiled call's outputs come from the pool: results the caller keeps are never
    overwritten by later calls, whatever the pool recycles."""
    net = nn.Dense(2048, in_units=64)
    net.initialize()
    net.hybridize(backend="llvm")
    xs = [hb.random.normal(size=(4, 64)) for _ in range(6)]
    kept = [net(x) for x in xs]
    expect = [x.asnumpy() @ net.weight.data().asnumpy().T + net.bias.data().asnumpy()
              for x in xs]
    for _ in range(5):  # freed outputs recycled meanwhile
        net(xs[0]).wait_to_read()
    for y, e in zip(kept, expect):
        np.testing.assert_allclose(y.asnumpy(), e, rtol=1e-5, atol=1e-5)


def test_pool_can_be_turned_off():
    old = config.get("HYBRID_HOST_POOL_MB")
    try:
        config.set_flag("HYBRID_HOST_POOL_MB", 0)
        assert host_pool() is None
    finally:
        config.set_flag("HYBRID_HOST_POOL_MB", old)
    assert host_pool() is not None


def test_reused_array_is_writeable_and_shaped_as_asked():
    pool = HostPool(1 << 30)
    a, addr = pool.empty((10, 100), np.float32, 4000)
    a.flags.writeable = False  # what a caller did with the last array of this block
    del a
    b, addr_b = pool.empty((10, 100), np.float32, 4000)
    assert addr_b == addr and b.flags.writeable
    del b
    c, addr_c = pool.empty((1000,), np.int32, 4000)
    assert addr_c == addr and c.shape == (1000,) and c.dtype == np.int32


def test_free_blocks_of_another_size_make_room():
    """Blocks a finished workload left must not keep the next one unpooled."""
    pool = HostPool(2 * (8000 + HostPool.ALIGN))
    old = [pool.empty((1000,), np.float64, 8000)[0] for _ in range(2)]
    assert pool.held == 2 * (8000 + HostPool.ALIGN)
    del old  # free now: the next size may take their room
    a, _ = pool.empty((500,), np.float64, 4000)
    assert 4000 in pool.blocks and len(pool.blocks[4000]) == 1
    assert pool.held <= pool.limit
    live = pool.empty((500,), np.float64, 4000)[0], a  # noqa: F841 - both in use
    stuck = HostPool(8000 + HostPool.ALIGN)
    keep = stuck.empty((1000,), np.float64, 8000)[0]  # noqa: F841 - in use: cannot go
    stuck.empty((500,), np.float64, 4000)
    assert 4000 not in stuck.blocks or not stuck.blocks[4000]


def test_pool_works_in_a_forked_child_even_if_its_lock_was_held():
    import os
    pool = host_pool()
    pool.lock.acquire()  # as if another thread were allocating at fork time
    try:
        pid = os.fork()
        if pid == 0:  # child: must not hang on the copied, held lock
            try:
                a, _ = pool.empty((1600,), np.float32, 6400)
                os._exit(0 if a.shape == (1600,) else 1)
            except BaseException:  # noqa: BLE001
                os._exit(1)
    finally:
        pool.lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
