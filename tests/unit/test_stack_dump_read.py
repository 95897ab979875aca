"""cluster.stack reads a worker's faulthandler dump from a file the worker writes from its signal
handler (flowlab/cluster/local.py ``_read_dump``). A worker just resumed on a loaded machine can
stop for longer than the quiet time between two threads' blocks: the dump is complete only once
the main thread's block (down to serve_exec) is there. Seen in a CI run: the stack of a resumed
worker came back without its main thread."""
import threading
import time

from flowlab.cluster import local

OTHER = 'Thread 0x00007f0000000001 (most recent call first):\n  File "unix.py", line 811 in send\n\n'
MAIN = ('Current thread 0x00007f0000000002 (most recent call first):\n  File "server.py", line 90 in serve_exec\n'
        '  File "worker.py", line 300 in main\n')


def test_a_dump_that_pauses_between_threads_is_read_whole(tmp_path):
    path = tmp_path / "stack"
    path.write_text("")

    def worker():   # another thread's block, a pause several times the quiet time, then the main thread's
        with open(path, "a") as f:
            f.write(OTHER)
        time.sleep(8 * local._QUIET)
        with open(path, "a") as f:
            f.write(MAIN)

    writer = threading.Thread(target=worker)
    writer.start()
    try:
        text = local._read_dump(str(path), timeout=5.0)
    finally:
        writer.join()
    assert text == OTHER + MAIN
    assert local._main_first(text).startswith("Main thread 0x00007f0000000002 (runs your code):")


def test_without_the_main_thread_it_gives_what_came_at_the_deadline(tmp_path):
    path = tmp_path / "stack"
    path.write_text(OTHER)
    start = time.monotonic()
    assert local._read_dump(str(path), timeout=0.3) == OTHER
    assert time.monotonic() - start < 2.0


def test_nothing_written_is_none(tmp_path):
    path = tmp_path / "stack"
    path.write_text("")
    assert local._read_dump(str(path), timeout=0.1) is None
