import signal
import threading
import time

from transformer.errors import stops_held


def test_a_storm_of_stops_leaves_every_handler_as_it_was():
    """A Ctrl-C raised between two of the handlers put back (its own first) left SIGTERM's and SIGHUP's recording
    stand-ins in place for good: every later SIGTERM was recorded and never acted on, and `kill` no longer stopped
    the command. Each stop taken inside the block is acted on after it."""
    armed = [False]  # Ctrl-C raises in the test's try alone, not in its own loop, once each time it is armed

    def interrupted(signum, frame):
        if armed[0]:
            armed[0] = False
            raise KeyboardInterrupt

    def terminated(signum, frame):
        pass

    stops = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
    before = {s: signal.getsignal(s) for s in stops}
    mine = {signal.SIGINT: interrupted, signal.SIGTERM: terminated, signal.SIGHUP: terminated}
    done = threading.Event()

    def storm() -> None:
        while not done.is_set():
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            time.sleep(0.0005)

    for s, handler in mine.items():
        signal.signal(s, handler)
    stormer, interrupts, passes = threading.Thread(target=storm), 0, 0
    try:
        stormer.start()
        end = time.monotonic() + 2
        while time.monotonic() < end:
            try:
                armed[0] = True
                with stops_held():
                    sum(range(200))
                armed[0] = False
                passes += 1
            except KeyboardInterrupt:
                interrupts += 1
        done.set()
        stormer.join()
        assert {s: signal.getsignal(s) for s in stops} == mine
        assert interrupts > 10 and passes > 0  # the storm was one
    finally:
        done.set()
        for s, handler in before.items():
            signal.signal(s, handler)
