/*
 * Shared zdtm-style victim protocol for the ckpt end-to-end tests.
 *
 * A victim is started as `victim WORKDIR`.  It builds its state, records what
 * it must find again later, then calls victim_ready_and_wait(), which writes
 * WORKDIR/ready (atomically) and polls for WORKDIR/go every ~10 ms.  While
 * waiting it also answers WORKDIR/ping with WORKDIR/pong so the harness can
 * tell "the restored process is executing victim code again" without ending
 * the test.  After go the victim verifies its state and calls victim_finish(),
 * which writes WORKDIR/result ("PASS" or "FAIL: <first reason>") and exits 0
 * or 1.
 *
 * Deliberately avoids stdio and malloc in the paths that run between "ready"
 * and the verification, because those could change the heap/brk or the fd
 * table that the victims compare before and after restore.
 */
#ifndef CKPT_VICTIM_H
#define CKPT_VICTIM_H

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <unistd.h>

/* A victim that never gets its go file (harness crashed) must not live forever. */
#define VICTIM_LIFETIME_SEC 300

static const char *victim_workdir;
static char victim_first_failure[512];
static int victim_failures;
static struct timespec victim_deadline;
/*
 * Random per-incarnation id, written to WORKDIR/incarnation at ready and to
 * WORKDIR/incarnation.final just before the result.  A "restore" that simply
 * re-executed the victim would write a new one, so the harness can tell a
 * restored process from a fresh one that merely passes its own checks.
 */
static uint64_t victim_nonce;

static inline void victim_path(char *buf, size_t len, const char *name)
{
	snprintf(buf, len, "%s/%s", victim_workdir, name);
}

static inline void victim_write_all(int fd, const char *s, size_t len)
{
	while (len > 0) {
		ssize_t n = write(fd, s, len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			_exit(3);
		s += n;
		len -= (size_t)n;
	}
}

/* Write WORKDIR/name atomically: the harness must never see a partial file. */
/* Reads exactly len bytes, retrying after signals; -1 on end of file or
 * an error. */
static inline int victim_read_exact(int fd, char *buf, size_t len)
{
	size_t got = 0;
	while (got < len) {
		ssize_t n = read(fd, buf + got, len - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			return -1;
		got += (size_t)n;
	}
	return 0;
}

static inline void victim_write_file(const char *name, const char *content)
{
	char tmp[PATH_MAX], dst[PATH_MAX];
	int fd;

	snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", victim_workdir, name);
	victim_path(dst, sizeof(dst), name);
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		_exit(3);
	victim_write_all(fd, content, strlen(content));
	close(fd);
	if (rename(tmp, dst) != 0)
		_exit(3);
}

static inline int victim_file_exists(const char *name)
{
	char p[PATH_MAX];

	victim_path(p, sizeof(p), name);
	return access(p, F_OK) == 0;
}

/* Record a failure; the first one becomes the result line, all go to stderr. */
static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline void fail(const char *fmt, ...)
{
	char msg[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (victim_failures++ == 0)
		snprintf(victim_first_failure, sizeof(victim_first_failure), "%s", msg);
	victim_write_all(2, "FAIL: ", 6);
	victim_write_all(2, msg, strlen(msg));
	victim_write_all(2, "\n", 1);
}

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		if (!(cond))                                                   \
			fail(__VA_ARGS__);                                     \
	} while (0)

/* Setup errors: nothing to verify later, report and stop immediately. */
static void die(const char *what) __attribute__((noreturn));
static inline void die(const char *what)
{
	char msg[600];

	snprintf(msg, sizeof(msg), "FAIL: setup: %s: %s", what, strerror(errno));
	victim_write_file("result", msg);
	victim_write_all(2, msg, strlen(msg));
	victim_write_all(2, "\n", 1);
	_exit(2);
}

static void victim_finish(void) __attribute__((noreturn));
static inline void victim_finish(void)
{
	char msg[600];

	snprintf(msg, sizeof(msg), "%016llx", (unsigned long long)victim_nonce);
	victim_write_file("incarnation.final", msg);

	if (victim_failures == 0) {
		victim_write_file("result", "PASS");
		_exit(0);
	}
	snprintf(msg, sizeof(msg), "FAIL: %s (%d failures)", victim_first_failure,
		 victim_failures);
	victim_write_file("result", msg);
	_exit(1);
}

static inline void victim_init(int argc, char **argv)
{
	if (argc < 2) {
		static const char usage[] = "usage: victim WORKDIR\n";
		victim_write_all(2, usage, sizeof(usage) - 1);
		_exit(2);
	}
	victim_workdir = argv[1];
	if (getrandom(&victim_nonce, sizeof(victim_nonce), 0) != sizeof(victim_nonce))
		die("getrandom");
	clock_gettime(CLOCK_MONOTONIC, &victim_deadline);
	victim_deadline.tv_sec += VICTIM_LIFETIME_SEC;
}

static inline int victim_timespec_passed(const struct timespec *deadline)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return now.tv_sec > deadline->tv_sec ||
	       (now.tv_sec == deadline->tv_sec && now.tv_nsec >= deadline->tv_nsec);
}

/*
 * Sleep ~10 ms.  nanosleep may return EINTR once after restore (and whenever
 * a handled signal arrives); the caller's loop tolerates that, so the return
 * value is ignored on purpose.
 */
static inline void victim_tick(void)
{
	struct timespec ts = { 0, 10 * 1000 * 1000 };

	nanosleep(&ts, NULL);
}

/* Answer a harness ping: proves the (restored) victim code is running. */
static inline void victim_poll_ping(void)
{
	char p[PATH_MAX];

	if (!victim_file_exists("ping"))
		return;
	victim_path(p, sizeof(p), "ping");
	unlink(p);
	victim_write_file("pong", "pong");
}

/* Block until WORKDIR/<name> exists, answering pings meanwhile. */
static inline void victim_wait_for(const char *name)
{
	while (!victim_file_exists(name)) {
		if (victim_timespec_passed(&victim_deadline)) {
			fail("timed out waiting for %s", name);
			victim_finish();
		}
		victim_poll_ping();
		victim_tick();
	}
}

/* Publish the incarnation id, then the ready file (with optional content). */
static inline void victim_signal_ready(const char *ready_content)
{
	char id[32];

	snprintf(id, sizeof(id), "%016llx", (unsigned long long)victim_nonce);
	victim_write_file("incarnation", id);
	victim_write_file("ready", ready_content ? ready_content : "ready");
}

/*
 * In a forked child whose parent answers the pings: wait until the test
 * writes go, exiting with `timeout_code` past the victim's deadline (the
 * parent's check of the child's status reports it).
 */
static inline void victim_child_wait_go(int timeout_code)
{
	while (!victim_file_exists("go")) {
		victim_tick();
		if (victim_timespec_passed(&victim_deadline))
			_exit(timeout_code);
	}
}

/*
 * Puts the fd `fd` just opened (dying if the open failed) at number
 * `want`, so a test can name the victim's fds.
 */
static inline void victim_fd_at(int fd, int want)
{
	if (fd < 0)
		die("open");
	if (fd != want) {
		if (dup2(fd, want) != want)
			die("dup2");
		close(fd);
	}
}

static inline void victim_ready_and_wait(const char *ready_content)
{
	victim_signal_ready(ready_content);
	victim_wait_for("go");
}

/* 64-bit FNV-1a style hash over a byte range, word at a time when aligned. */
static inline uint64_t hash_bytes(const volatile void *p, size_t len, uint64_t h)
{
	const volatile unsigned char *b = p;
	size_t i = 0;

	if (((uintptr_t)b & 7) == 0) {
		const volatile uint64_t *w = (const volatile uint64_t *)b;
		for (; i + 8 <= len; i += 8) {
			h ^= w[i / 8];
			h *= 0x100000001b3ULL;
			h ^= h >> 29;
		}
	}
	for (; i < len; i++) {
		h ^= b[i];
		h *= 0x100000001b3ULL;
	}
	return h;
}

/* Deterministic pattern: every 8-byte word depends on seed and position. */
static inline void fill_pattern(volatile void *p, size_t len, uint64_t seed)
{
	volatile unsigned char *b = p;
	uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;

	for (size_t i = 0; i < len; i++) {
		if ((i & 7) == 0) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			x += i;
		}
		b[i] = (unsigned char)(x >> ((i & 7) * 8));
	}
}

/* Read a whole (small, e.g. /proc) file into buf without malloc; NUL-terminates. */
static inline size_t read_small_file(const char *path, char *buf, size_t cap)
{
	size_t len = 0;
	int fd = open(path, O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return (size_t)-1;
	while (len + 1 < cap) {
		ssize_t n = read(fd, buf + len, cap - 1 - len);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	buf[len] = '\0';
	return len;
}

/*
 * /proc/PID/stat of pid, read into buf; returns the fields after the
 * command name (from field 3, the state, on), or NULL when pid is gone.
 */
static inline const char *proc_stat_fields(pid_t pid, char *buf, size_t cap)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	size_t n = read_small_file(path, buf, cap);
	if (n == (size_t)-1 || n == 0)
		return NULL;
	const char *p = strrchr(buf, ')');
	return p && p[1] == ' ' ? p + 2 : NULL;
}

/* pid's state letter (R, S, T, Z, ...), or '?' when it is gone. */
static inline char proc_state(pid_t pid)
{
	char buf[1024];
	const char *f = proc_stat_fields(pid, buf, sizeof(buf));
	return f ? f[0] : '?';
}

/* Whether fd is an anonymous-inode file of that kind ("eventfd", ...). */
static inline int victim_fd_is_anon(int fd, const char *kind)
{
	char link[64], path[64], want[64];

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	snprintf(want, sizeof(want), "anon_inode:[%s]", kind);
	ssize_t n = readlink(path, link, sizeof(link) - 1);
	if (n < 0)
		return 0;
	link[n] = 0;
	return strcmp(link, want) == 0;
}

/* Whether /proc/self/fdinfo/FD contains `line`. */
static inline int victim_fdinfo_has(int fd, const char *line)
{
	char path[64], buf[1024];

	snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
	if (read_small_file(path, buf, sizeof(buf)) == (size_t)-1)
		return 0;
	return strstr(buf, line) != NULL;
}

/* Reaps child `pid` and checks it exited 0 (`who` names it in the failure). */
static inline void victim_check_child(pid_t pid, const char *who)
{
	int st;

	CHECK(waitpid(pid, &st, 0) == pid, "waitpid %s: %s", who, strerror(errno));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s failed: status %#x", who, st);
}

#endif
