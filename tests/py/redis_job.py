"""A redis-server (a real server nobody here wrote) with a client inside
the same tree. Run as `redis_job.py WORKDIR PORT`: starts
`redis-server` on 127.0.0.1:PORT as a child, connects to it over TCP,
stores a 1 MiB value, then INCRs a counter 3000 times over the same
connection (about 10 s, writing WORKDIR/progress), and at the end checks the
counter, the value and a list the client appended to: WORKDIR/result is
"PASS ..." when everything the client wrote is there exactly once.
"""
import hashlib
import os
import socket
import subprocess
import sys
import time

ROUNDS = 3000


def write(workdir, name, text):
    tmp = os.path.join(workdir, "." + name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.rename(tmp, os.path.join(workdir, name))


class Redis:
    """Just enough of RESP for this job, over one TCP connection."""

    def __init__(self, port):
        deadline = time.time() + 20
        while True:
            try:
                self.s = socket.create_connection(("127.0.0.1", port))
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.05)
        self.buf = b""

    def _line(self):
        while b"\r\n" not in self.buf:
            chunk = self.s.recv(1 << 16)
            if not chunk:
                raise EOFError("server closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _exact(self, n):
        while len(self.buf) < n + 2:
            chunk = self.s.recv(1 << 16)
            if not chunk:
                raise EOFError("server closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def _reply(self):
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind in (b"+", b":"):
            return rest
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self._exact(n)
        if kind == b"*":
            return [self._reply() for _ in range(int(rest))]
        raise RuntimeError(f"bad reply {line!r}")

    def call(self, *args):
        out = b"*%d\r\n" % len(args)
        for a in args:
            a = a if isinstance(a, bytes) else str(a).encode()
            out += b"$%d\r\n%s\r\n" % (len(a), a)
        self.s.sendall(out)
        return self._reply()


def main():
    workdir, port = sys.argv[1], int(sys.argv[2])
    server = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1",
         "--save", "", "--appendonly", "no", "--dir", workdir,
         "--daemonize", "no", "--logfile", os.path.join(workdir, "redis.log")],
        stdin=subprocess.DEVNULL,
    )
    r = Redis(port)
    big = os.urandom(1 << 20)
    r.call("SET", "big", big)
    for i in range(1, ROUNDS + 1):
        if int(r.call("INCR", "counter")) != i:
            write(workdir, "result", f"FAIL counter is not {i}")
            return 1
        r.call("RPUSH", "log", i)
        time.sleep(0.003)
        if i % 50 == 0:
            write(workdir, "progress", str(i))
    counter = int(r.call("GET", "counter"))
    log = [int(x) for x in r.call("LRANGE", "log", 0, -1)]
    same_big = r.call("GET", "big") == big
    server.terminate()
    server.wait()
    if counter != ROUNDS or log != list(range(1, ROUNDS + 1)) or not same_big:
        write(workdir, "result", f"FAIL counter {counter}, log of {len(log)}, big value kept: {same_big}")
        return 1
    write(workdir, "result", f"PASS {hashlib.sha256(big).hexdigest()[:16]} {counter}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
