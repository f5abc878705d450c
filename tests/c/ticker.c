/*
 * Ticker victim: writes "tick N" lines to its stdout (a pipe to the test,
 * outside the dumped tree) every ~10 ms, ready at tick 20; after go it
 * writes "done N" and passes. Restored with its stdout handed over as an
 * external pipe, the ticks must carry on, numbered from where they were.
 */
#include "victim.h"

int main(int argc, char **argv)
{
	unsigned long n = 0;
	char line[32];

	victim_init(argc, argv);
	for (;;) {
		int len = snprintf(line, sizeof(line), "tick %lu\n", ++n);
		victim_write_all(1, line, (size_t)len);
		if (n == 20)
			victim_signal_ready(NULL);
		if (n > 20 && victim_file_exists("go"))
			break;
		victim_poll_ping();
		victim_tick();
		if (victim_timespec_passed(&victim_deadline)) {
			fail("timed out waiting for go");
			victim_finish();
		}
	}
	int len = snprintf(line, sizeof(line), "done %lu\n", n);
	victim_write_all(1, line, (size_t)len);
	victim_finish();
}
