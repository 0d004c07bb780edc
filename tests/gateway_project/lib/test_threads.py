"""A thread pool started at its full size (gateway_project/lib/threads.py): a pool grows only when all its threads
are busy, so without it a process's memory stepped up at whatever hour the load first reached a new peak."""

from concurrent.futures import ThreadPoolExecutor

from gateway_project.lib.threads import executor_fill


def test_a_filled_pool_has_every_thread_at_once_where_a_plain_one_grows_on_demand():
    with ThreadPoolExecutor(6) as plain, ThreadPoolExecutor(6) as filled:
        for _ in range(6):
            plain.submit(int).result()  # one at a time: the first thread serves them all
        executor_fill(filled, 6)
        assert (len(plain._threads), len(filled._threads)) == (1, 6)
