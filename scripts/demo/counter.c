/* Sample program for the ckpt demo: counts, keeps a checksum of 8 MiB of
 * heap it keeps rewriting, and prints a line every 200 ms. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int main(void)
{
	size_t n = 8u << 20;
	uint8_t *buf = malloc(n);
	uint64_t sum = 0;
	for (unsigned long tick = 1;; tick++) {
		for (size_t i = 0; i < n; i += 4096)
			buf[i] = (uint8_t)(tick + i / 4096);
		sum = 0;
		for (size_t i = 0; i < n; i += 4096)
			sum += buf[i];
		printf("pid %d tick %lu heap-sum %llu\n", getpid(), tick, (unsigned long long)sum);
		fflush(stdout);
		struct timespec ts = { 0, 200 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
}
