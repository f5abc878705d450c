/*
 * Counter victim: increments an in-memory counter every ~10 ms and appends
 * it to WORKDIR/counter.log through an O_APPEND fd kept open for the whole
 * run.  Becomes ready once the counter reaches 20 and keeps counting.
 *
 * After go it checks that the counter continued from its pre-ready value
 * (memory survived) and that the last line of the log is its own current
 * value (the restored fd still appends to the same file).  The harness checks
 * the log from outside too: after every restore the new lines must continue
 * at dump value + 1, never restart from 1.
 *
 * If the go file contains "exit N" the victim skips its checks and exits
 * with status N: the harness uses it to test exit-code propagation.
 */
#include "victim.h"

#define READY_AT 20

static char log_buf[1 << 20];

static unsigned long last_logged_value(const char *path)
{
	size_t len = read_small_file(path, log_buf, sizeof(log_buf));
	char *end, *start;

	if (len == (size_t)-1 || len == 0)
		return 0;
	end = log_buf + len;
	if (end[-1] == '\n')
		*--end = '\0';
	start = strrchr(log_buf, '\n');
	return strtoul(start ? start + 1 : log_buf, NULL, 10);
}

int main(int argc, char **argv)
{
	char path[PATH_MAX], line[32];
	unsigned long counter = 0, ready_value = 0;
	int fd;

	victim_init(argc, argv);
	victim_path(path, sizeof(path), "counter.log");
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
	if (fd < 0)
		die("open counter.log");

	for (;;) {
		counter++;
		snprintf(line, sizeof(line), "%lu\n", counter);
		victim_write_all(fd, line, strlen(line));
		if (counter == READY_AT) {
			ready_value = counter;
			snprintf(line, sizeof(line), "%lu", counter);
			victim_signal_ready(line);
		}
		if (ready_value && victim_file_exists("go"))
			break;
		if (victim_timespec_passed(&victim_deadline)) {
			fail("timed out waiting for go");
			victim_finish();
		}
		victim_poll_ping();
		victim_tick();
	}

	victim_path(path, sizeof(path), "go");
	if (read_small_file(path, line, sizeof(line)) != (size_t)-1 &&
	    strncmp(line, "exit ", 5) == 0)
		_exit(atoi(line + 5));
	victim_path(path, sizeof(path), "counter.log");

	CHECK(counter > ready_value, "counter %lu did not advance past ready value %lu", counter,
	      ready_value);
	CHECK(last_logged_value(path) == counter,
	      "last line of counter.log is %lu, in-memory counter is %lu", last_logged_value(path),
	      counter);
	victim_finish();
}
