"""OpenCV's thread pool around the forking of worker processes (the training loader's and the test
pipeline's): it does not survive fork, so the parent's is shut down while forking, and each worker uses
one thread (the pool of processes is the parallelism)."""
import contextlib

import cv2


@contextlib.contextmanager
def fork_guard():
    """Wrap the forking of workers. OpenCV's thread pool does not survive fork: a child touching it
    waits forever for threads that exist only in the parent. So the parent's pool is shut down
    (one thread) while forking and restored afterwards."""
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        yield
    finally:
        cv2.setNumThreads(threads)


def process_start():
    """Per-process set-up: one OpenCV thread per worker (the pool is the parallelism)."""
    cv2.setNumThreads(1)
