/*
 * Slurm job victim (not the ready/go protocol: a batch job runs it):
 * slurm_steps STEPS PERIOD_MS. Keeps 4 MiB of 64-bit words whose value at
 * step s is mix(i, s). Every step first checks every word still holds the
 * previous step's value (so a restore that lost or mixed up memory shows),
 * then rewrites them and prints "step S/STEPS sum X". At the end it prints
 * "done STEPS sum X" (the test recomputes X) and exits 0; a bad word prints
 * "BAD step S word I" and exits 1. Lines go out with write(2), no stdio
 * buffer, so the job's output file shows each step as it happens.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define WORDS (4u * 1024 * 1024 / sizeof(uint64_t))

static uint64_t mix(uint64_t i, uint64_t s)
{
	uint64_t z = i * 0x9e3779b97f4a7c15ull + s * 0xbf58476d1ce4e5b9ull + 1;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void say(const char *line)
{
	size_t len = strlen(line), off = 0;
	while (off < len) {
		ssize_t n = write(1, line + off, len - off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			exit(2);
		off += (size_t)n;
	}
}

static void pause_ms(long ms)
{
	struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };
	while (nanosleep(&t, &t) < 0 && errno == EINTR)
		;
}

int main(int argc, char **argv)
{
	char line[128];
	if (argc != 3) {
		say("usage: slurm_steps STEPS PERIOD_MS\n");
		return 2;
	}
	unsigned long steps = strtoul(argv[1], NULL, 10);
	long period = strtol(argv[2], NULL, 10);
	uint64_t *w = malloc(WORDS * sizeof(*w));
	if (!w)
		return 2;
	for (uint64_t i = 0; i < WORDS; i++)
		w[i] = mix(i, 0);
	uint64_t sum = 0;
	for (unsigned long s = 1; s <= steps; s++) {
		sum = 0;
		for (uint64_t i = 0; i < WORDS; i++) {
			if (w[i] != mix(i, s - 1)) {
				snprintf(line, sizeof(line), "BAD step %lu word %llu\n", s,
					 (unsigned long long)i);
				say(line);
				return 1;
			}
			w[i] = mix(i, s);
			sum += w[i];
		}
		snprintf(line, sizeof(line), "step %lu/%lu sum %016llx\n", s, steps,
			 (unsigned long long)sum);
		say(line);
		if (s < steps)
			pause_ms(period);
	}
	snprintf(line, sizeof(line), "done %lu sum %016llx\n", steps, (unsigned long long)sum);
	say(line);
	return 0;
}
