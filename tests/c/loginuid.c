/*
 * The audit login uid (/proc/self/loginuid), as a login (pam_loginuid)
 * sets it for a session: set to LOGINUID before a thread is started, so
 * both have it. After go, the process and its thread still have it (a
 * restore that left it alone gives them the restorer's).
 */
#include "victim.h"

#include <pthread.h>

#define LOGINUID 4242u

static unsigned read_loginuid(const char *path)
{
	char buf[32];
	if (read_small_file(path, buf, sizeof(buf)) == (size_t)-1)
		die("read loginuid");
	return (unsigned)strtoul(buf, NULL, 10);
}

static void *idle(void *arg)
{
	(void)arg;
	for (;;)
		pause();
	return NULL;
}

static void check(const char *when, pid_t tid)
{
	char path[64];
	if (read_loginuid("/proc/self/loginuid") != LOGINUID)
		fail("%s: loginuid %u, want %u", when, read_loginuid("/proc/self/loginuid"),
		     LOGINUID);
	snprintf(path, sizeof(path), "/proc/self/task/%d/loginuid", (int)tid);
	if (read_loginuid(path) != LOGINUID)
		fail("%s: thread %d: loginuid %u, want %u", when, (int)tid, read_loginuid(path),
		     LOGINUID);
}

static volatile pid_t thread_tid;

static void *note_tid(void *arg)
{
	thread_tid = gettid();
	return idle(arg);
}

int main(int argc, char **argv)
{
	victim_init(argc, argv);
	int fd = open("/proc/self/loginuid", O_WRONLY);
	if (fd < 0)
		die("open /proc/self/loginuid");
	char text[16];
	int len = snprintf(text, sizeof(text), "%u", LOGINUID);
	if (write(fd, text, (size_t)len) != len)
		die("write /proc/self/loginuid");
	close(fd);
	pthread_t th;
	if (pthread_create(&th, NULL, note_tid, NULL) != 0)
		die("pthread_create");
	while (!thread_tid)
		usleep(1000);
	check("before the dump", thread_tid);
	victim_ready_and_wait("ready");
	check("after the restore", thread_tid);
	victim_finish();
}
