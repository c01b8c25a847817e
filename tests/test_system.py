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
