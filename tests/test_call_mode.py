"""Where long compiled calls run (hybrid/call_mode.py): a trial of both paths on a synthetic
clock, then the real thing: long calls give the same results on either path, inference and
training."""
import numpy as np
import pytest

import hybrid as hb
from hybrid import autograd, call_mode, dispatch, loss, nn
from hybrid.call_mode import PATIENCE, RETRY, TRIAL, WINDOWS, DispatchTrial


class Loop:
    """A loop whose iterations make long calls ("fwd", "bwd"): in the caller an iteration
    takes `caller_us`; on the engine `engine_us` once its work is drained."""

    def __init__(self, caller_us, engine_us, margin=1.0, retry=RETRY):
        self.trial, self.now = DispatchTrial(margin, retry), 0.0
        self.caller, self.engine = caller_us * 1e-6, engine_us * 1e-6
        self.backlog, self.drains, self.paths = 0.0, 0, []
        self.syncs, self.sync_every = 0, 0  # the loop's own sync points, every n iterations

    def clock(self):
        return self.now

    def drain(self, timeout):
        self.drains += 1
        self.now += self.backlog
        self.backlog = 0.0
        return True

    def iteration(self):
        for key, share in (("fwd", 0.5), ("bwd", 0.5)):
            direct = self.trial.direct(key, self.clock, self.drain, lambda: self.syncs)
            self.paths.append(direct)
            if direct:
                self.now += share * self.caller
            else:  # a push returns at once: the work waits in the engine's backlog
                self.backlog += share * self.engine
        self.iterations = getattr(self, "iterations", 0) + 1
        if self.sync_every and self.iterations % self.sync_every == 0:
            self.syncs += 1
            self.now += self.backlog
            self.backlog = 0.0

    def run(self, iterations):
        for _ in range(iterations):
            self.iteration()
        return self


def trial_iterations():
    return TRIAL * WINDOWS + 1  # the anchor's call after the last window decides


def test_windows_alternate_then_the_faster_path_is_kept():
    loop = Loop(caller_us=1000, engine_us=1300).run(trial_iterations() + 20)
    per_window = [loop.paths[2 * TRIAL * w] for w in range(WINDOWS)]
    assert per_window == [False] + [False, True] * ((WINDOWS - 1) // 2)  # warm-up, engine first
    assert loop.trial.choice is True and all(loop.paths[2 * (trial_iterations() - 1):])
    assert loop.drains == WINDOWS  # every window ends drained (the engine's work counted)
    assert loop.trial.per_iter[True] == pytest.approx([1e-3] * ((WINDOWS - 1) // 2))
    assert loop.trial.per_iter[False] == pytest.approx([1.3e-3] * ((WINDOWS - 1) // 2))


def test_the_engine_wins_when_it_overlaps_the_callers_python():
    loop = Loop(caller_us=1000, engine_us=800).run(trial_iterations() + 5)
    assert loop.trial.choice is False and not any(loop.paths[2 * trial_iterations():])


@pytest.mark.parametrize("engine_us,engine_kept", [(900, False), (800, True)])
def test_an_eager_trial_keeps_the_engine_only_when_clearly_faster(engine_us, engine_kept):
    # eager ops' trials (dispatch.long_call_direct(eager=True)): a 10% engine win is within
    # what their windows mismeasure, a 20% one (two devices overlapping) is not
    loop = Loop(caller_us=1000, engine_us=engine_us,
                margin=call_mode.EAGER_ENGINE_MARGIN).run(trial_iterations() + 5)
    assert loop.trial.choice is (not engine_kept)


def test_a_pausing_loop_keeps_the_engine():
    loop = Loop(caller_us=PATIENCE * 2e6, engine_us=PATIENCE * 2e6).run(trial_iterations())
    assert loop.trial.choice is False


def test_the_trial_is_repeated_after_retry_long_calls():
    loop = Loop(caller_us=1000, engine_us=1300).run(trial_iterations())
    assert loop.trial.choice is True
    loop.caller = 2e-3  # the loop around the calls changed: the caller is slower now
    loop.run(RETRY // 2 + trial_iterations() + 1)
    assert loop.trial.choice is False


def test_an_eager_trial_is_repeated_after_its_own_longer_retry():
    loop = Loop(caller_us=1000, engine_us=1300, margin=call_mode.EAGER_ENGINE_MARGIN,
                retry=call_mode.EAGER_RETRY).run(trial_iterations())
    assert loop.trial.choice is True
    loop.caller = 2e-3  # the engine is now 35% faster: worth a trial, but not yet
    loop.run(RETRY // 2 + trial_iterations() + 1)
    assert loop.trial.choice is True
    loop.run(call_mode.EAGER_RETRY // 2 + trial_iterations() + 1)
    assert loop.trial.choice is False


def test_a_loop_that_starts_syncing_every_iteration_is_tried_again():
    loop = Loop(caller_us=1000, engine_us=800).run(trial_iterations())
    assert loop.trial.choice is False and loop.trial.sync_rate == 0
    loop.sync_every = 1  # now it reads its loss every iteration
    loop.engine = 1.3e-3  # and the engine path got slower for it
    loop.run(TRIAL + 1)
    assert loop.trial.choice is None  # trying again, well before RETRY calls
    loop.run(trial_iterations())
    assert loop.trial.choice is True and loop.trial.sync_rate == pytest.approx(1.0, abs=0.05)
    loop.run(3 * TRIAL)  # a steady loop: no more trials
    assert loop.trial.choice is True


def test_an_engine_that_stays_busy_ends_the_trial_on_the_engine():
    trial = DispatchTrial()
    for _ in range(2 * TRIAL + 1):
        trial.direct("fwd", lambda: 0.0, lambda timeout: False, lambda: 0)
    assert trial.choice is False


def test_a_new_loop_gets_a_new_anchor():
    loop = Loop(caller_us=1000, engine_us=1300)
    loop.trial.direct("a call before the loop", loop.clock, loop.drain, lambda: 0)
    loop.run(trial_iterations() + call_mode.ANCHOR_GAP)  # the anchor never comes back
    assert loop.trial.anchor == "fwd" and loop.trial.choice is True
    loop.caller = 2e-3
    for _ in range(call_mode.ANCHOR_GAP + 1):  # another loop, without "fwd"
        loop.trial.direct("other", loop.clock, loop.drain, lambda: 0)
    assert loop.trial.anchor == "other" and loop.trial.choice is None


@pytest.fixture
def short_trials(monkeypatch):
    monkeypatch.setattr(dispatch, "_INLINE_US", 0.0)  # every call counts as long
    monkeypatch.setattr(call_mode, "TRIAL", 2)
    monkeypatch.setattr(call_mode, "RETRY", 10)  # try both paths again and again
    monkeypatch.setattr(dispatch, "_trials", {})


def test_long_inference_calls_match_on_either_path(short_trials, dispatch_paths):
    paths = dispatch_paths
    net = nn.HybridSequential()
    net.add(nn.Dense(32, activation="relu"), nn.Dense(4))
    net.initialize()
    x = hb.random.normal(size=(16, 20))
    want = net(x).asnumpy()  # eager
    net.hybridize()
    net(x).wait_to_read()  # the first call's cost, once known, makes the later ones "long"
    outs = [net(x) for _ in range(60)]
    for o in outs:
        np.testing.assert_allclose(o.asnumpy(), want, rtol=1e-5, atol=1e-6)
    assert paths["direct"] > 0 and paths["engine"] > 0  # the trials took both paths


def test_training_steps_match_on_either_path(short_trials):
    def train(hybridize):
        hb.random.seed(3)
        net = nn.HybridSequential()
        net.add(nn.Dense(16, activation="relu"), nn.Dense(3))
        net.initialize(hb.init.Xavier())
        x = hb.random.normal(size=(8, 5))
        y = hb.array(np.arange(8) % 3, dtype="int32")
        lf = loss.SoftmaxCrossEntropyLoss()
        if hybridize:
            net.hybridize()
            lf.hybridize()
        tr = hb.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
        losses = []
        for step in range(30):
            with autograd.record():
                lv = lf(net(x), y)
            lv.backward()
            tr.step(8)
            if step % 3 == 0:  # syncs now and then: both paths get windows
                losses.append(float(lv.mean().asnumpy()))
        return losses, net[0].weight.data().asnumpy()
    (l_eager, w_eager), (l_hyb, w_hyb) = train(False), train(True)
    np.testing.assert_allclose(l_hyb, l_eager, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(w_hyb, w_eager, rtol=1e-4, atol=1e-6)
