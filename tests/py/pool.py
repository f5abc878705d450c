"""A multiprocessing job ckpt did not write: a Pool of 4 workers maps a slow
function over 800 tasks while a Queue carries progress records to a
reporter thread. Run as `pool.py WORKDIR`: writes WORKDIR/progress (tasks
done so far, rewritten as results arrive) and, at the end,
WORKDIR/result ("PASS <sum>" when every result is right and arrived once).
"""
import multiprocessing as mp
import os
import sys
import threading
import time

TASKS = 800


def work(n):
    # Slow enough that a checkpoint lands mid-computation.
    time.sleep(0.05)
    acc = 0
    for i in range(2000):
        acc = (acc * 31 + n + i) % 1_000_003
    return n, acc


def expected(n):
    acc = 0
    for i in range(2000):
        acc = (acc * 31 + n + i) % 1_000_003
    return acc


def write(workdir, name, text):
    tmp = os.path.join(workdir, "." + name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(workdir, name))


def reporter(q, workdir):
    done = 0
    while True:
        item = q.get()
        if item is None:
            return
        done += 1
        if done % 10 == 0:
            write(workdir, "progress", str(done))


def main():
    workdir = sys.argv[1]
    q = mp.Queue()
    t = threading.Thread(target=reporter, args=(q, workdir), daemon=True)
    t.start()
    seen = {}
    with mp.Pool(4) as pool:
        for n, acc in pool.imap_unordered(work, range(TASKS), chunksize=2):
            if n in seen:
                write(workdir, "result", f"FAIL task {n} arrived twice")
                return 1
            seen[n] = acc
            q.put(n)
    q.put(None)
    t.join()
    bad = [n for n in range(TASKS) if seen.get(n) != expected(n)]
    if bad:
        write(workdir, "result", f"FAIL wrong or missing results for {bad[:5]}")
        return 1
    write(workdir, "result", f"PASS {sum(seen.values())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
