"""Stop requests: the recorder of SIGTERM, SIGUSR1 and SIGINT takes the signals back from whatever
replaced it, and restores what it replaced."""

import signal
import threading
import time


def test_the_stop_recorder_takes_the_signals_back_from_whatever_replaced_it():
    """What ``ray.init`` does to a run's stop handler: replaced by another, the recorder is set
    again by a second install (or reclaim, which leaves a process that never installed it
    alone); signals sent while they are blocked are recorded when the block ends; restore puts
    back the handlers of before the first install."""
    from gmc.stop import StopRequests

    stop = StopRequests()

    def original(signum, frame):
        pass

    def rays(signum, frame):
        raise AssertionError("the replacing handler ran")

    before = {s: signal.signal(s, original) for s in stop.SIGNALS}
    try:
        stop.reclaim()
        assert all(signal.getsignal(s) is original for s in stop.SIGNALS)
        stop.install()
        signal.signal(signal.SIGTERM, rays)
        stop.reclaim()
        with stop.blocked():  # sent to this thread (to the process, another thread may take it)
            for s in stop.SIGNALS:
                signal.pthread_kill(threading.get_ident(), s)
            time.sleep(0.05)
            assert stop.received == []
        deadline = time.time() + 5
        while len(stop.received) < len(stop.SIGNALS) and time.time() < deadline:
            time.sleep(0.01)
        assert sorted(stop.received) == sorted(stop.SIGNALS)
        stop.install()
        stop.restore()
        assert all(signal.getsignal(s) is original for s in stop.SIGNALS) and not stop.received
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
