"""Stop signals: a Ctrl-C whose KeyboardInterrupt is dropped (inside a fork hook) is raised later."""

import signal

import pytest

from packer.system import clear_stop_request, request_stop, stop_signals_held


def test_a_dropped_stop_request_is_raised_when_the_held_block_ends():
    clear_stop_request()
    try:
        request_stop(signal.SIGTERM, None)  # as if its KeyboardInterrupt were dropped by an at-fork hook
    except KeyboardInterrupt:
        pass
    with pytest.raises(KeyboardInterrupt):
        with stop_signals_held():
            pass
    with stop_signals_held():  # raised once, then forgotten
        pass


def test_an_interrupt_that_propagated_is_not_raised_twice():
    clear_stop_request()
    with pytest.raises(KeyboardInterrupt):
        with stop_signals_held():
            request_stop(signal.SIGINT, None)
    with stop_signals_held():  # the interrupt left the block: it was not lost, so not raised again
        pass


def test_a_stop_requested_inside_the_held_block_is_raised_at_its_end_not_where_it_landed():
    """A signal that slipped in before the block blocked it runs its handler at the next chance: inside
    the block that can be one of fork's at-fork hooks, where a raise is printed as a traceback and
    dropped. Inside the block the handler only notes the request; the block raises it once, at its end."""
    clear_stop_request()
    steps = []
    with pytest.raises(KeyboardInterrupt):
        with stop_signals_held():
            request_stop(signal.SIGTERM, None)  # returns: nothing raised where it landed
            steps.append("the fork finished and its worker was recorded")
    assert steps == ["the fork finished and its worker was recorded"]
    with stop_signals_held():  # raised once, then forgotten
        pass
    with pytest.raises(KeyboardInterrupt):
        request_stop(signal.SIGINT, None)  # outside any block it raises at once, as before
    clear_stop_request()


def test_a_stop_noted_in_a_block_that_fails_otherwise_is_not_forgotten():
    clear_stop_request()
    with pytest.raises(OSError):
        with stop_signals_held():
            request_stop(signal.SIGTERM, None)
            raise OSError("fork refused")
    with pytest.raises(KeyboardInterrupt):  # the user still asked to stop: the next block says so
        with stop_signals_held():
            pass


def test_a_stop_that_lands_in_a_multiprocessing_finalizer_comes_again_after_it(capfd):
    """Raised inside a finalizer (the garbage collector freeing a shared memory block), the interrupt
    would be printed as "Exception ignored" with a traceback and lost: it is delivered again once
    the finalizer is over, and nothing is printed."""
    import gc
    import sys
    import time
    from multiprocessing.util import Finalize

    class Block:
        pass

    landed = []
    previous = signal.signal(signal.SIGTERM, request_stop), signal.signal(signal.SIGINT, request_stop)  # as the CLI
    try:
        with pytest.raises(KeyboardInterrupt):
            block = Block()
            Finalize(block, lambda: landed.append(request_stop(signal.SIGTERM, sys._getframe())))
            del block
            gc.collect()
            for _ in range(500):  # the signal comes again within moments; this loop is where it lands
                time.sleep(0.01)
        assert landed == [None]  # the handler returned inside the finalizer, and raised after it
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
        clear_stop_request()
    assert "Exception ignored" not in capfd.readouterr().err


def test_a_stop_sent_again_is_not_once_one_was_raised_or_the_command_ended():
    import sys
    import time
    from multiprocessing.util import Finalize

    class Block:
        pass

    def landed_in_a_finalizer():
        block = Block()
        Finalize(block, lambda: request_stop(signal.SIGTERM, sys._getframe()))
        del block  # its finalizer runs here: the handler there sends the signal again later

    received = []
    previous = signal.signal(signal.SIGTERM, request_stop), signal.signal(signal.SIGINT, request_stop)
    try:
        landed_in_a_finalizer()
        with pytest.raises(KeyboardInterrupt):
            request_stop(signal.SIGTERM, None)  # a second Ctrl-C, raised where it landed
        landed_in_a_finalizer()
        for sig in (signal.SIGTERM, signal.SIGINT):  # the command ended: its handlers gone
            signal.signal(sig, lambda *a: received.append(a))
        for _ in range(30):  # well past the moment either would have been sent again
            time.sleep(0.01)
    finally:
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
        clear_stop_request()
    assert received == []


def test_a_stop_sent_again_wakes_a_main_thread_that_waits():
    """The signal comes again as a real one: a main thread blocked on a lock (an upload's result)
    is woken, not left until the lock is released."""
    import sys
    import threading
    from multiprocessing.util import Finalize

    class Block:
        pass

    previous = signal.signal(signal.SIGTERM, request_stop), signal.signal(signal.SIGINT, request_stop)
    held = threading.Lock()
    held.acquire()
    release = threading.Timer(20, held.release)  # the "upload": the test fails by time only if not woken
    release.start()
    try:
        block = Block()
        Finalize(block, lambda: request_stop(signal.SIGTERM, sys._getframe()))
        with pytest.raises(KeyboardInterrupt):
            del block
            held.acquire()  # blocked here when the signal comes again
        assert release.is_alive()  # woken before the lock was released
    finally:
        release.cancel()
        signal.signal(signal.SIGTERM, previous[0])
        signal.signal(signal.SIGINT, previous[1])
        clear_stop_request()
